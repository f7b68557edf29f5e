"""Transcoder sets registered for attribution: read from a directory the operator allows (the
same path confinement as SAEs), checked against the loaded model, remembered in the store.

A set fits the loaded model when it reads residuals of the model's width and has no block past
its depth; it is checked at registration and again when a graph uses it (the model may have
changed since). The store keeps where each set lies; the book reads the files when it is made,
after a registration and when another replica registers one, and keeps the sets in memory (at
most SETS_KEPT), so a graph request never reads a file. A set whose files can no longer be read
stays registered and is refused by name, with the reason, until it is deleted. Each file of a
set is also an SAE of its own (interp/formats.py): that is how its features are read and steered.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from millm.engine.loader import LoadedModel
from millm.errors import Conflict, InvalidRequest, NotFound
from millm.interp.attribution.replacement import Source
from millm.interp.transcoder_files import TranscoderFileError, TranscoderSet
from millm.interp.transcoders import read_transcoder_set
from millm.kernel.books.base import Book
from millm.store.database import Store
from millm.store.transcoders import (
    delete_transcoder_set,
    insert_transcoder_set,
    transcoder_set_rows,
)

SETS_KEPT = 8


@dataclass(frozen=True)
class Registered:
    """A registered set: its id (a hash of its path and config), where it lies, and its
    transcoders."""

    id: str
    path: Path
    transcoders: TranscoderSet

    def view(self) -> dict:
        """As GET /api/transcoders lists it."""
        found = self.transcoders
        return {
            "id": self.id,
            "object": "transcoder_set",
            "kind": found.kind,
            "path": str(self.path),
            "layers": sorted(found.layers),
            "d_model": found.d_model,
            "d_transcoder": found.d_transcoder,
            "architecture": found.architecture,
            "feature_input_hook": found.input_hook,
            "feature_output_hook": found.output_hook,
            "labelled_features": sum(len(labels) for labels in found.labels.values()),
            "skip_connections": sorted(found.skips),
            "files": [str(found.files[layer]) for layer in sorted(found.files)],
        }

    def sources(self, lm: LoadedModel, param: str) -> list[Source]:
        """One mlp source per block, after checking the set fits `lm` (400 naming `param`)."""
        check_fit(self.transcoders, lm, param)
        found = self.transcoders
        return [
            Source(f"{self.id}/{layer}", sae, layer, "mlp", found.skips.get(layer))
            for layer, sae in sorted(found.layers.items())
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


def read_set(path: Path) -> TranscoderSet:
    """The set at `path`, or a 400 naming `path` that says why it cannot be read."""
    try:
        return read_transcoder_set(path)
    except (TranscoderFileError, OSError) as exc:
        raise InvalidRequest(f"the transcoder set cannot be read: {exc}", param="path") from None


class TranscoderBook(Book):
    """The registered sets: their rows in the store, their transcoders in memory."""

    def __init__(self, store: Store, kept: int = SETS_KEPT):
        self.store, self.kept = store, kept
        super().__init__()

    # Book -----------------------------------------------------------------------------------------
    def _rows(self, ids: list[str] | None = None) -> list[dict]:
        return [row | {"name": row["id"]} for row in transcoder_set_rows(self.store, ids)]

    def _parse(self, row: dict) -> dict | None:
        path = Path(row["path"])
        try:
            return {"set": Registered(row["id"], path, read_set(path))}
        except InvalidRequest as exc:  # moved or changed since: kept, refused by name
            return {"error": exc.message}

    def _order(self, row: dict) -> object:
        return row["created_at"]

    def _missing(self, key: str, param: str = "set_id") -> NotFound:
        return NotFound(
            f"no transcoder set {key!r} is registered (GET /api/transcoders lists them)",
            param=param,
            code="transcoder_set_not_found",
        )

    # reads and writes -----------------------------------------------------------------------------
    def register(self, path: Path, lm: LoadedModel | None) -> Registered:
        """Read, check and store the set at `path` (blocking: a passing thread); 400 naming `path`
        for a set that cannot be read or does not fit the loaded model; 409 past the bound.
        Registering a set again returns it as registered."""
        found = read_set(path)
        if lm is not None:
            check_fit(found, lm, "path")
        key = set_id(path)
        with self.writing() as touched:
            new = key not in self.shelf.by_id
            if new and len(self.shelf.rows) >= self.kept:
                raise Conflict(
                    f"{self.kept} transcoder sets are registered already; delete one first",
                    param="path",
                )
            touched.add(key)  # read back, so a set registered again is read again
            if new:
                insert_transcoder_set(self.store, key, str(path))
        return self.get(key, "path")

    def get(self, set_id: str, param: str = "set_id") -> Registered:
        """A registered set (404 transcoder_set_not_found; 409 when its files cannot be read
        now)."""
        shelf = self.shelf
        if shelf.by_id.get(set_id) is None:
            raise self._missing(set_id, param)
        document = shelf.documents[set_id]
        if "error" in document:
            raise Conflict(
                f"transcoder set {set_id} is registered but {document['error']}; register it "
                "again or delete it",
                param=param,
                code="transcoder_set_unreadable",
            )
        return document["set"]

    def labels(self, source: str) -> dict[int, dict]:
        """The labels of one transcoder of a graph (its source name: `<set id>/<block>`); none
        when the set has none for it, or is gone or unreadable since the graph was made."""
        set_id, _, layer = source.rpartition("/")
        document = self.shelf.documents.get(set_id) or {}
        found = document.get("set")
        return found.transcoders.labels.get(int(layer), {}) if found is not None else {}

    def sets(self) -> list[dict]:
        """Every registered set as GET /api/transcoders lists it (an unreadable one with its
        reason)."""
        shelf = self.shelf
        views = []
        for row in shelf.rows:
            document = shelf.documents[row["id"]]
            if "error" in document:
                views.append(
                    {
                        "id": row["id"],
                        "object": "transcoder_set",
                        "path": row["path"],
                        "error": document["error"],
                    }
                )
            else:
                views.append(document["set"].view())
        return views

    def view(self, set_id: str) -> dict:
        """One set as GET /api/transcoders/{id} shows it."""
        key = self.find(set_id)["id"]  # the 404 first: no set may be registered at all
        return next(v for v in self.sets() if v["id"] == key)

    def delete(self, set_id: str) -> dict:
        """Forget a set (its files stay)."""
        key = self.find(set_id)["id"]
        with self.writing() as touched:
            touched.add(key)
            delete_transcoder_set(self.store, key)
        return {"id": key, "object": "transcoder_set", "deleted": True}
