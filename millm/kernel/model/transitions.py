"""Where the model slot stands, as values: a model change in progress, a model's view, and the
refusals that name them (so the switch and the views word them the same way). Pure functions:
the switch calls them under its mutex."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from millm.engine.loader import LoadedModel
from millm.errors import Conflict, MillmError, ModelBusy, ModelLocked, ModelNotLoaded
from millm.kernel.model.registry import ModelState, RegisteredModel


class ModelStatus(StrEnum):
    """Where the model slot is (readiness reports it)."""

    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    ERROR = "error"  # the last model it tried to load failed
    UNLOADED = "unloaded"  # empty after an unload, or before the start-up load began


@dataclass(frozen=True)
class Transition:
    """A model change in progress: what is being loaded and what is being unloaded for it."""

    loading: str | None = None
    unloading: str | None = None
    startup: bool = False


@dataclass(frozen=True)
class ModelView:
    """A registered model and where it is now, for the API to present."""

    entry: RegisteredModel
    state: ModelState
    error: str | None
    lm: LoadedModel | None
    locked: bool


def busy_message(transition: Transition | None) -> str:
    """What a request refused during a model change is told."""
    if transition is None:
        return "a model change is in progress; retry once it finishes"
    if transition.unloading and transition.loading:
        return (
            f"model {transition.unloading!r} is being unloaded to load {transition.loading!r}; "
            "retry once it finishes"
        )
    if transition.unloading:
        return f"model {transition.unloading!r} is being unloaded; retry once it finishes"
    return f"model {transition.loading!r} is being loaded; retry once it finishes"


# An unload frees memory in seconds; a load reads weights for longer.
RETRY_AFTER_UNLOAD = 5


def busy(transition: Transition | None, param: str = "model") -> ModelBusy:
    """503 model_busy for a request refused during a model change, with its wait: shorter
    while a model is only being unloaded."""
    unload_only = transition is not None and transition.unloading and not transition.loading
    return ModelBusy(
        busy_message(transition),
        param=param,
        retry_after=RETRY_AFTER_UNLOAD if unload_only else None,
    )


def status_of(
    transition: Transition | None, loaded: LoadedModel | None, last: str, errors: dict[str, str]
) -> ModelStatus:
    """Where the slot is: moving, holding a model, or empty (after a failed load of `last`, or
    not)."""
    if transition is not None:
        return ModelStatus.UNLOADING if transition.unloading else ModelStatus.LOADING
    if loaded is not None:
        return ModelStatus.LOADED
    return ModelStatus.ERROR if last in errors else ModelStatus.UNLOADED


def state_of(
    name: str, transition: Transition | None, loaded: LoadedModel | None, errors: dict[str, str]
) -> ModelState:
    """A registered model's state, from the slot's transition, its model and the failed loads."""
    if transition is not None and transition.unloading == name:
        return ModelState.UNLOADING
    if transition is not None and transition.loading == name:
        return ModelState.LOADING
    if loaded is not None and loaded.name == name:
        return ModelState.LOADED
    return ModelState.ERROR if name in errors else ModelState.READY


def view_of(
    entry: RegisteredModel,
    transition: Transition | None,
    loaded: LoadedModel | None,
    errors: dict[str, str],
    locked: str | None,
) -> ModelView:
    """A registered model's view, from the slot's transition, its model, the failed loads and the
    lock."""
    lm = loaded if loaded is not None and loaded.name == entry.name else None
    state = state_of(entry.name, transition, loaded, errors)
    return ModelView(entry, state, errors.get(entry.name), lm, locked == entry.name)


def unleased(name: str, transition: Transition | None, errors: dict[str, str]) -> MillmError | None:
    """Why a request for `name`, which is not loaded, cannot have it now; None when a load may
    start."""
    if transition is not None:
        if transition.startup and transition.loading == name:
            return ModelNotLoaded(
                f"model {name!r} is not loaded yet; retry once it has loaded", param="model"
            )
        return busy(transition)
    if name in errors:
        return ModelNotLoaded(
            f"model {name!r} is not loaded: its last load failed ({errors[name]}); "
            f"it is not retried on demand: POST /api/models/{name}/load once it is fixed",
            param="model",
        )
    return None


def unforgettable(name: str, state: ModelState, locked: str | None) -> MillmError | None:
    """Why the registration of `name` cannot be deleted now (409 while loaded or moving, or
    locked)."""
    if state in (ModelState.LOADED, ModelState.LOADING, ModelState.UNLOADING):
        return Conflict(
            f"model {name!r} is {state.value}; unload it first", param="model", code="model_loaded"
        )
    if locked == name:
        return ModelLocked(f"model {name!r} is locked for steering; unlock it first", param="model")
    return None
