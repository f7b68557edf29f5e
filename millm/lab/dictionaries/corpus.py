"""A dictionary's corpus as a stream of token windows: read lazily (files line by line, a saved
dataset row by row from its memory-mapped Arrow file), so its size never bounds memory.

Each document is tokenised as /v1/completions tokenises a prompt (a conversation through the chat
template, as /v1/chat/completions renders it) and cut into consecutive windows of `context_size`
tokens; a last piece shorter than MIN_WINDOW is dropped. Window i is held out when i % HELD_OUT
is HELD_OUT - 1: a training never reads those, and a grade with `part: "held_out"` reads only
those, so a dictionary trained here is graded on text it never saw.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from millm.engine.prompts import completion_prompt_ids
from millm.errors import InvalidRequest
from millm.interp.sae_files import SAEInfo
from millm.lab.calibration.protocol import (
    CalibrationMessage,
    Entry,
    rendered_conversation,
    shipped_entries,
)
from millm.lab.dictionaries.protocol import DictionaryCorpus

HELD_OUT = 20  # every 20th window is held out
MIN_WINDOW = 8  # tokens: a shorter last piece of a document is not read
PARAGRAPH_CHARS = 20_000  # a .txt paragraph past this is cut into documents of this size


@dataclass(frozen=True)
class CorpusWindow:
    """A window's number in the corpus and its token ids."""

    index: int
    ids: list[int]

    @property
    def held_out(self) -> bool:
        """Whether a training leaves it out."""
        return self.index % HELD_OUT == HELD_OUT - 1


@dataclass(frozen=True)
class OpenedCorpus:
    """A checked corpus: its documents (re-readable from the start) and how to describe it."""

    spec: DictionaryCorpus
    documents: Callable[[], Iterator[Entry]]
    name: str  # what provenance records: the SAE, the files, the dataset

    def windows(self, tokenizer, context_length: int) -> Iterator[CorpusWindow]:
        """Every window, in order."""
        size = min(self.spec.context_size, context_length)
        index = 0
        for where, content in self.documents():
            ids = _ids(tokenizer, content, where)
            for start in range(0, len(ids), size):
                piece = ids[start : start + size]
                if len(piece) < MIN_WINDOW:
                    break
                yield CorpusWindow(index, piece)
                index += 1

    def describe(self) -> dict:
        """Provenance: the source, its name, the window size."""
        return {
            "source": self.spec.source,
            "name": self.name,
            "context_size": self.spec.context_size,
        }


def _ids(tokenizer, content, where: str) -> list[int]:
    if isinstance(content, str):
        return completion_prompt_ids(tokenizer, content)
    return rendered_conversation(tokenizer, content, where)


def open_corpus(
    spec: DictionaryCorpus, sae: Callable[[str], SAEInfo], local: Callable[[str, str], Path]
) -> OpenedCorpus:
    """The corpus checked before any work starts (the SAE registered, each path allowed and
    readable, the dataset loadable with its column): a 400 or 403 naming the field otherwise.
    `sae` looks an SAE up, `local` confines a path (403 path_not_allowed)."""
    if spec.shipped_by is not None:
        info = sae(spec.shipped_by)
        entries = shipped_entries(info)  # the 400 when it ships none, now
        return OpenedCorpus(spec, lambda: iter(entries), f"calibration corpus of {info.id}")
    if spec.texts is not None:
        texts = list(spec.texts)
        return OpenedCorpus(
            spec,
            lambda: ((f"texts[{i}]", t) for i, t in enumerate(texts)),
            f"{len(texts)} texts",
        )
    if spec.files is not None:
        paths = [_readable(local(given, f"files[{i}]"), f"files[{i}]") for i, given in
                 enumerate(spec.files)]  # fmt: skip
        return OpenedCorpus(
            spec, lambda: _file_documents(paths), ", ".join(str(path) for path in paths)
        )
    assert spec.dataset is not None
    folder = local(spec.dataset, "dataset")
    rows = _dataset_column(folder, spec.column)  # refused now when it cannot be read
    return OpenedCorpus(spec, lambda: _dataset_documents(folder, spec.column, rows), str(folder))


def _readable(path: Path, param: str) -> Path:
    if not path.is_file():
        raise InvalidRequest(f"{param}: {path} is not a file", param=param)
    if path.suffix not in (".txt", ".jsonl", ".md"):
        raise InvalidRequest(f"{param}: {path.name} is neither .txt, .md nor .jsonl", param=param)
    return path


def _file_documents(paths: list[Path]) -> Iterator[Entry]:
    for path in paths:
        if path.suffix == ".jsonl":
            yield from _jsonl_documents(path)
        else:
            yield from _paragraphs(path)


def _paragraphs(path: Path) -> Iterator[Entry]:
    """A text file's paragraphs (runs of lines between blank ones), read line by line."""
    lines: list[str] = []
    size = 0
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                lines.append(line)
                size += len(line)
            if (not line.strip() or size >= PARAGRAPH_CHARS) and lines:
                yield f"{path.name} line {number}", "".join(lines).strip()
                lines, size = [], 0
    if lines:
        yield f"{path.name} end", "".join(lines).strip()


def _jsonl_documents(path: Path) -> Iterator[Entry]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path.name} line {number}"
            try:
                entry = json.loads(line)
                if "messages" in entry:
                    yield where, [CalibrationMessage.model_validate(m) for m in entry["messages"]]
                else:
                    yield where, str(entry["text"])
            except (ValueError, KeyError, TypeError) as exc:
                raise InvalidRequest(
                    f"{where} is not a text or a conversation ({exc})", param="corpus"
                ) from None


def _dataset_column(folder: Path, column: str):
    """The dataset's split to read (a DatasetDict's `train`, else its first); 400 when it cannot
    be loaded or has no such column."""
    import datasets

    try:
        loaded = datasets.load_from_disk(str(folder))
    except (FileNotFoundError, ValueError, OSError) as exc:
        raise InvalidRequest(
            f"dataset: {folder} is not a dataset saved with save_to_disk ({exc})", param="dataset"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        loaded = loaded["train"] if "train" in loaded else next(iter(loaded.values()))
    if column not in loaded.column_names:
        raise InvalidRequest(
            f"column: the dataset has no column {column!r} (it has {loaded.column_names})",
            param="column",
        )
    return loaded


def _dataset_documents(folder: Path, column: str, rows) -> Iterator[Entry]:
    for number, text in enumerate(rows.select_columns([column]).iter(batch_size=64)):
        for offset, value in enumerate(text[column]):
            if isinstance(value, str) and value.strip():
                yield f"{folder.name} row {number * 64 + offset}", value
