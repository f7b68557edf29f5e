"""Transcoder sets registered for attribution: read from a directory the operator allows (the
same path confinement as SAEs), checked against the loaded model, kept in memory.

A set fits the loaded model when it reads residuals of the model's width and has no block past
its depth; it is checked at registration and again when a graph uses it (the model may have
changed since). Sets live in memory, at most SETS_KEPT: a restart forgets them (register again);
they are graph sources only: inspecting, calibrating or steering a transcoder's features is
not offered yet.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path

from millm.engine.loader import LoadedModel
from millm.errors import Conflict, InvalidRequest, NotFound
from millm.interp.attribution.replacement import Source
from millm.interp.transcoders import TranscoderFileError, TranscoderSet, read_transcoder_set

SETS_KEPT = 8


@dataclass(frozen=True)
class Registered:
    """A registered set: its id (a hash of its path and config), where it lies, and its transcoders."""

    id: str
    path: Path
    transcoders: TranscoderSet

    def view(self) -> dict:
        """As GET /api/transcoders lists it."""
        found = self.transcoders
        return {
            "id": self.id,
            "object": "transcoder_set",
            "path": str(self.path),
            "layers": sorted(found.layers),
            "d_model": found.d_model,
            "d_transcoder": found.d_transcoder,
            "architecture": found.architecture,
            "feature_input_hook": found.input_hook,
            "feature_output_hook": found.output_hook,
        }

    def sources(self, lm: LoadedModel, param: str) -> list[Source]:
        """One mlp source per block, after checking the set fits `lm` (400 naming `param`)."""
        check_fit(self.transcoders, lm, param)
        return [
            Source(f"{self.id}/{layer}", sae, layer, "mlp")
            for layer, sae in sorted(self.transcoders.layers.items())
        ]


def check_fit(found: TranscoderSet, lm: LoadedModel, param: str) -> None:
    """The set's width and blocks against the model's (400 naming `param`)."""
    width, depth = int(lm.config.hidden_size), int(lm.config.num_hidden_layers)
    if found.d_model != width:
        raise InvalidRequest(
            f"the transcoders read residuals of width {found.d_model}; {lm.name}'s is {width}",
            param=param,
            code="sae_model_mismatch",
        )
    past = [layer for layer in found.layers if layer >= depth]
    if past:
        raise InvalidRequest(
            f"the set has transcoders for blocks {past}; {lm.name} has blocks 0..{depth - 1}",
            param=param,
            code="sae_model_mismatch",
        )


def set_id(path: Path) -> str:
    """A stable id for a set: its resolved path and its config's bytes."""
    digest = hashlib.sha256(str(path).encode() + (path / "config.yaml").read_bytes())
    return "tc_" + digest.hexdigest()[:12]


class TranscoderBook:
    """The registered sets, bounded, thread-safe."""

    def __init__(self, kept: int = SETS_KEPT):
        self.kept = kept
        self._sets: dict[str, Registered] = {}
        self._lock = threading.Lock()

    def register(self, path: Path, lm: LoadedModel | None) -> Registered:
        """Read and keep the set at `path` (blocking torch work: a passing thread); 400 naming
        `path` for a set that cannot be read or does not fit the loaded model; 409 past the bound."""
        try:
            found = read_transcoder_set(path)
            key = set_id(path)
        except (TranscoderFileError, OSError) as exc:
            raise InvalidRequest(
                f"the transcoder set cannot be read: {exc}", param="path"
            ) from None
        if lm is not None:
            check_fit(found, lm, "path")
        registered = Registered(key, path, found)
        with self._lock:
            if key not in self._sets and len(self._sets) >= self.kept:
                raise Conflict(
                    f"{self.kept} transcoder sets are registered already; delete one first",
                    param="path",
                )
            self._sets[key] = registered
        return registered

    def get(self, set_id: str, param: str = "set_id") -> Registered:
        """A registered set, or 404 transcoder_set_not_found."""
        with self._lock:
            found = self._sets.get(set_id)
        if found is None:
            raise NotFound(
                f"no transcoder set {set_id!r} is registered (they are kept in memory: register it again after a restart)",
                param=param,
                code="transcoder_set_not_found",
            )
        return found

    def all(self) -> list[Registered]:
        """Every registered set."""
        with self._lock:
            return list(self._sets.values())

    def delete(self, set_id: str) -> dict:
        """Forget a set."""
        found = self.get(set_id)
        with self._lock:
            self._sets.pop(found.id, None)
        return {"id": found.id, "object": "transcoder_set", "deleted": True}
