"""The model registry: the models this server may serve, by the name clients send as `model`.

A registration remembers what was asked for (a checkpoint directory, a .gguf file or a hub id)
and is kept in the store, so it survives a restart and is shared by replicas on one database.
Registering checks what does not depend on this machine (the source resolves, the config
parses, the weight files are whole); whether a model can run *here* (its quantization, free
memory) is checked at each load, because free memory changes and replicas may differ.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from millm.engine.sources import ModelSource, resolve_source
from millm.errors import (
    AmbiguousModelName,
    Conflict,
    InvalidRequest,
    ModelNotFound,
    ModelSourceError,
)
from millm.kernel.model.checkpoints import Checkpoint, inspect
from millm.store.database import Store
from millm.store.models import model_rows, put_model, remove_model

MAX_NAME = 200


@dataclass(frozen=True)
class RegisteredModel:
    """One registration: its name, what it points at, and what inspection found."""

    name: str
    reference: str
    kind: str
    owned_by: str
    registered_at: float
    info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The stored and reported fields."""
        return {
            "id": self.name,
            "source": self.reference,
            "kind": self.kind,
            "owned_by": self.owned_by,
            "created": int(self.registered_at),
            "parameters": self.info.get("parameters"),
            "quantization": self.info.get("quantization"),
        }


def check_name(name: str) -> str:
    """A usable model name: 1-200 printable characters, no surrounding spaces."""
    if not name or len(name) > MAX_NAME or name != name.strip() or not name.isprintable():
        raise InvalidRequest(
            f"model name {name!r} is not usable: give 1-{MAX_NAME} printable characters without "
            "surrounding spaces",
            param="name",
        )
    return name


def canonical_reference(source: ModelSource) -> str:
    """What a registration points at: an absolute path for local files (the server's working
    directory may differ after a restart), the hub id or demo name as given."""
    if source.kind == "directory":
        return str(source.directory)
    if source.kind == "gguf":
        return str(source.gguf_path)
    return source.reference


def describe_checkpoint(source: ModelSource, checkpoint: Checkpoint) -> dict:
    """What the listing shows about a checkpoint (kept with the registration)."""
    quant = checkpoint.quantization
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    return {
        "parameters": checkpoint.parameters,
        "quantization": method or ("gguf" if source.gguf_file else None),
    }


class ModelRegistry:
    """Registered models by name; every change is stored at once."""

    def __init__(
        self, store: Store, hub_dir: Path, variant_named: Callable[[str], bool] = lambda _: False
    ):
        self.store = store
        self.hub_dir = hub_dir
        # Models and steered variants share one namespace: a client names either as `model`.
        self.variant_named = variant_named
        self._lock = threading.Lock()
        self._entries: dict[str, RegisteredModel] = {}
        self.reload()

    def reload(self) -> None:
        """Read the registrations again (at start, and when another replica changed one)."""
        entries = {}
        for row in model_rows(self.store):
            info = dict(row["info"])
            kind, owned_by = info.pop("kind", "directory"), info.pop("owned_by", "local")
            entries[row["name"]] = RegisteredModel(
                row["name"], row["reference"], kind, owned_by, row["registered_at"], info
            )
        with self._lock:
            self._entries = entries

    def all(self) -> list[RegisteredModel]:
        """Every registration, oldest first."""
        with self._lock:
            return sorted(self._entries.values(), key=lambda entry: entry.registered_at)

    def find(self, name: str) -> RegisteredModel | None:
        """The registration of `name`, if any."""
        with self._lock:
            return self._entries.get(name)

    def canonical(self, name: str) -> str:
        """The registered name `name` means: itself, or for a bare repository name the one
        `repo:QUANT` registered (400 AMBIGUOUS_MODEL_NAME naming the tags when there are
        several)."""
        with self._lock:
            if name in self._entries or ":" in name:
                return name
            tagged = sorted(
                entry for entry in self._entries if entry.partition(":")[0] == name and ":" in entry
            )
        if len(tagged) > 1:
            tags = ", ".join(entry.partition(":")[2] for entry in tagged)
            raise AmbiguousModelName(
                f"model {name!r} has several quantizations registered ({tags}): name one as "
                f"{name}:TAG, e.g. {tagged[0]!r}",
                param="model",
            )
        return tagged[0] if tagged else name

    def get(self, name: str, read_through: bool = True) -> RegisteredModel:
        """The registration of `name`, or 404 model_not_found naming what is registered. A name not
        known here is looked up in the store once more first (registered through another replica
        a moment ago, before its notice arrived?), unless `read_through` is False: the event loop
        never reads the store."""
        entry = self.find(name)
        if entry is None and read_through:
            self.reload()
            entry = self.find(name)
        if entry is None:
            known = ", ".join(repr(e.name) for e in self.all()) or "none"
            raise ModelNotFound(
                f"The model {name!r} does not exist on this server (registered: {known})",
                param="model",
            )
        return entry

    def register(
        self, reference: str, name: str | None, local: bool = True
    ) -> tuple[RegisteredModel, bool]:
        """Resolve and inspect `reference` (blocking: a hub id may download); returns (entry, newly
        registered).

        The same name and reference again is not an error (200, as for SAEs); a name already
        given to something else is a 409. With `local` False it is looked up as a hub id only.
        """
        try:
            source = resolve_source(reference, self.hub_dir, local=local)
            checkpoint = inspect(source)
        except ModelSourceError as exc:
            raise InvalidRequest(
                f"cannot register {reference!r}: {exc}", param="source", code="invalid_model_source"
            ) from None
        name = check_name(name if name is not None else source.name)
        if self.variant_named(name):
            raise Conflict(
                f"{name!r} names a steered variant (/api/variants), and clients name models and "
                "variants alike; give another name",
                param="name",
                code="model_exists",
            )
        reference = canonical_reference(source)
        with self._lock:
            existing = self._entries.get(name)
            if existing is not None:
                if existing.reference == reference:
                    return existing, False
                raise Conflict(
                    f"the name {name!r} is already registered for {existing.reference!r}; give "
                    "another name",
                    param="name",
                    code="model_exists",
                )
            entry = self._put(
                name, source, reference, describe_checkpoint(source, checkpoint), time.time()
            )
        return entry, True

    def ensure(self, name: str, source: ModelSource) -> RegisteredModel:
        """Register the start-up model under its served name (the operator's --model wins over an
        older registration of that name); its files are inspected when it loads."""
        with self._lock:
            existing = self._entries.get(name)
            reference = canonical_reference(source)
            if existing is not None and existing.reference == reference:
                return existing
            registered_at = existing.registered_at if existing is not None else time.time()
            return self._put(name, source, reference, {}, registered_at)

    def note(self, name: str, source: ModelSource, checkpoint: Checkpoint) -> None:
        """Remember what inspecting a registered model found (after a load inspected it again)."""
        with self._lock:
            entry = self._entries.get(name)
            info = describe_checkpoint(source, checkpoint)
            if entry is not None and entry.info != info:
                self._put(name, source, entry.reference, info, entry.registered_at)

    def source(self, name: str) -> ModelSource:
        """Resolve a registration again (files may have moved since): ModelSourceError if it no
        longer resolves."""
        entry = self.get(name)
        # A hub registration never turns into a local path that happens to share its name.
        return resolve_source(entry.reference, self.hub_dir, local=entry.kind != "hub")

    def forget(self, name: str) -> None:
        """Remove a registration (the caller checks it is not loaded or locked)."""
        self.get(name)
        with self._lock:
            remove_model(self.store, name)
            self._entries.pop(name, None)

    def _put(
        self, name: str, source: ModelSource, reference: str, info: dict, registered_at: float
    ) -> RegisteredModel:
        stored = {"kind": source.kind, "owned_by": source.owned_by, **info}
        put_model(self.store, name, reference, stored, registered_at)
        entry = RegisteredModel(name, reference, source.kind, source.owned_by, registered_at, info)
        self._entries[name] = entry
        return entry


class ModelState(StrEnum):
    """Where a registered model is in its life on this server."""

    READY = "ready"  # registered, not loaded: a request naming it loads it
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    ERROR = "error"  # its last load failed (the message says why); not retried on demand


# What /v1/models lists: every model a client may name and expect to be served once it is loaded.
AVAILABLE = frozenset(
    {ModelState.READY, ModelState.LOADING, ModelState.LOADED, ModelState.UNLOADING}
)
