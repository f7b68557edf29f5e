"""The sequences of one llama.cpp context: the rows', and the prefix cache's spans of KV cells.

Every row is a llama.cpp sequence in one context whose KV cells all sequences share
(`kv_unified`). Copying a span of one sequence to another (`llama_memory_seq_cp`) copies no
values: the cells are tagged with the second sequence too, and freed once no sequence holds
them. So the prefix cache keeps a block by tagging its cells with a sequence of its own, and a
prefill restores it by tagging them again with its row's: a hit costs no copy, and a cached
prefix takes no memory twice while a row uses it.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from millm.errors import InsufficientMemory


class CppBatch:
    """A batch's rows: one llama.cpp sequence each, and how many positions each has been fed."""

    def __init__(self, seqs: list[int], fed: list[int]):
        self.seqs, self.fed = seqs, fed


class Sequences:
    """Sequence ids of one context: handed out to owners (a batch, the prefix cache's cells: any
    object with a `seqs` collection), taken back (and their KV cells freed) once the owner is gone
    or lets them go. A batch dropped without a word (a lane reset, a scoring pass) is noticed
    through a weak reference the next time ids are needed."""

    def __init__(self, lib, memory, count: int):
        self.lib, self.memory, self.count = lib, memory, count
        self._owner: dict[int, weakref.ref] = {}
        # Called when rows need more ids than are free: the prefix cache gives back its own.
        self.short: Callable[[], None] | None = None

    def _reclaim(self) -> None:
        for seq, owner in list(self._owner.items()):
            held = owner()
            if held is None or seq not in held.seqs:
                self.free(seq)

    def in_use(self) -> int:
        """Sequences held by live owners (the others' KV cells are freed first)."""
        self._reclaim()
        return len(self._owner)

    def _free_ids(self, count: int) -> list[int]:
        self._reclaim()
        return [seq for seq in range(self.count) if seq not in self._owner][:count]

    def take(self, batch: CppBatch, rows: int) -> list[int]:
        """`rows` unused sequence ids, now owned by `batch` (the prefix cache's are taken back
        first when too few are free)."""
        free = self._free_ids(rows)
        if len(free) < rows and self.short is not None:
            self.short()
            free = self._free_ids(rows)
        if len(free) < rows:
            raise InsufficientMemory(
                f"llama.cpp's context has {self.count} sequences and {len(self._owner)} are in use; "
                f"{rows} more were needed (fewer concurrent rows, or a larger MAX_BATCH_SIZE at start-up)"
            )
        for seq in free:
            self._owner[seq] = weakref.ref(batch)
        return free

    def spare(self, owner) -> int | None:
        """One unused id for `owner`, or None when none is free (nothing is taken back for it)."""
        free = self._free_ids(1)
        if not free:
            return None
        self._owner[free[0]] = weakref.ref(owner)
        return free[0]

    def adopt(self, batch: CppBatch) -> None:
        """`batch` now owns all its sequences (after a merge)."""
        for seq in batch.seqs:
            self._owner[seq] = weakref.ref(batch)

    def free(self, seq: int) -> None:
        """Forget a sequence and free its KV cells."""
        self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)
        self._owner.pop(seq, None)


@dataclass(frozen=True)
class CellSpan:
    """Positions start..end of a cache sequence: one prefix-cache block's KV cells."""

    seq: int
    start: int
    end: int


class CellStore:
    """The prefix cache's storage on llama.cpp (prefix_cache.Storage): a block is a span of KV
    cells tagged with a cache sequence. A row's new blocks go to one cache sequence while each
    extends it, so a sequence never holds two cells at one position (a restore copies by
    position range); a sequence whose spans are all dropped is freed."""

    def __init__(self, sequences: Sequences, bytes_per_token: int):
        self.sequences, self.bytes_per_token = sequences, bytes_per_token
        self.seqs: set[int] = set()  # the cache sequences held (Sequences reads it)
        self._spans: Counter[int] = Counter()  # cache sequence -> live spans
        self._tail: dict[int, int] = {}  # cache sequence -> the end of its last span
        self._open: dict[int, int] = {}  # row sequence -> the cache sequence it stores into
        self._live: set[CellSpan] = set()
        self._clear: Callable[[], None] | None = None

    # prefix_cache.Storage ------------------------------------------------------------------
    def size(self, span: CellSpan) -> int:
        """Bytes of KV cells the span holds (once: the cells are shared with any row using them)."""
        return (span.end - span.start) * self.bytes_per_token

    def join(self, parts: list[CellSpan]) -> list[CellSpan]:
        """A chain's spans, in order (`LlamaCppRunner.begin` tags them with the row's sequence)."""
        return list(parts)

    def release(self, span: CellSpan) -> None:
        """Untag the span's cells; the last span of a cache sequence frees it."""
        if span not in self._live:  # already given back (a cache bound since dropped it)
            return
        self._live.discard(span)
        self.sequences.lib.llama_memory_seq_rm(
            self.sequences.memory, span.seq, span.start, span.end
        )
        self._spans[span.seq] -= 1
        if self._spans[span.seq] <= 0:
            del self._spans[span.seq]
            self._tail.pop(span.seq, None)
            self.seqs.discard(span.seq)
            self.sequences.free(span.seq)

    def bind(self, clear: Callable[[], None]) -> None:
        """The cache's `clear`: called when running rows need its cells or sequences. One cache
        at a time: the cells of one bound before (a scheduler since replaced) are given back."""
        for span in list(self._live):
            self.release(span)
        self._clear = clear
        self.sequences.short = clear

    # what the runner asks ---------------------------------------------------------------------
    def copy(self, row_seq: int, start: int, end: int) -> CellSpan | None:
        """Tag a row's cells start..end with a cache sequence; None when no sequence is free."""
        seq = self._open.get(row_seq)
        if seq is None or seq not in self.seqs or self._tail.get(seq) != start:
            seq = self.sequences.spare(self)
            if seq is None:
                return None
            self.seqs.add(seq)
            self._open[row_seq] = seq
        self.sequences.lib.llama_memory_seq_cp(self.sequences.memory, row_seq, seq, start, end)
        self._tail[seq] = end
        self._spans[seq] += 1
        span = CellSpan(seq, start, end)
        self._live.add(span)
        return span

    def held(self, spans: list[CellSpan]) -> int:
        """Positions of a restored chain still held, from its start (a cleared cache holds none)."""
        count = 0
        for span in spans:
            if span not in self._live:
                break
            count = span.end
        return count

    def restore(self, spans: list[CellSpan], row_seq: int, positions: int) -> None:
        """Tag the chain's cells before `positions` with the row's sequence."""
        lib, memory = self.sequences.lib, self.sequences.memory
        for span in spans:
            if span.start >= positions:
                break
            lib.llama_memory_seq_cp(memory, span.seq, row_seq, span.start, min(span.end, positions))

    def make_room(self) -> bool:
        """Drop every cached block (the KV cache is full); whether there were any."""
        if not self._live or self._clear is None:
            return False
        self._clear()
        return True
