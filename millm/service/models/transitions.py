"""Where the model slot stands, as values: a model change in progress, a model's view, and the
refusals that name them (so the switch and the views word them the same way)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from millm.engine.loader import LoadedModel
from millm.service.models.registry import ModelState, RegisteredModel


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
