"""The sequences of one llama.cpp context, and the prefix cache's copies of their KV cells.

Every row is a llama.cpp sequence in one context whose KV cells all sequences share
(`kv_unified`). The prefix cache keeps a block as llama.cpp saves a sequence's state: the block's
cells are tagged with a scratch sequence (`llama_memory_seq_cp` copies no values), saved to host
memory, and untagged; a prefill restores a chain the other way round into its row's sequence.
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass

from millm.errors import InsufficientMemory


class CppBatch:
    """A batch's rows: one llama.cpp sequence each, and how many positions each has been fed."""

    def __init__(self, seqs: list[int], fed: list[int]):
        self.seqs, self.fed = seqs, fed


class Sequences:
    """Sequence ids of one context: handed out to batches, taken back (and their KV cells freed)
    once the batch holding them is gone or lets them go. A batch dropped without a word (a lane
    reset, a scoring pass) is noticed through a weak reference the next time ids are needed."""

    def __init__(self, lib, memory, count: int):
        self.lib, self.memory, self.count = lib, memory, count
        self._owner: dict[int, weakref.ref] = {}

    def _reclaim(self) -> None:
        for seq, owner in list(self._owner.items()):
            batch = owner()
            if batch is None or seq not in batch.seqs:
                self.free(seq)

    def in_use(self) -> int:
        """Sequences held by live batches (the others' KV cells are freed first)."""
        self._reclaim()
        return len(self._owner)

    def take(self, batch: CppBatch, rows: int) -> list[int]:
        """`rows` unused sequence ids, now owned by `batch`."""
        self._reclaim()
        free = [seq for seq in range(self.count) if seq not in self._owner][:rows]
        if len(free) < rows:
            raise InsufficientMemory(
                f"llama.cpp's context has {self.count} sequences and {len(self._owner)} are in "
                f"use; {rows} more were needed (fewer concurrent rows, or a larger MAX_BATCH_SIZE "
                "at start-up)"
            )
        for seq in free:
            self._owner[seq] = weakref.ref(batch)
        return free

    def adopt(self, batch: CppBatch) -> None:
        """`batch` now owns all its sequences (after a merge)."""
        for seq in batch.seqs:
            self._owner[seq] = weakref.ref(batch)

    def free(self, seq: int) -> None:
        """Forget a sequence and free its KV cells."""
        self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)
        self._owner.pop(seq, None)


@dataclass(frozen=True, eq=False)
class SavedCells:
    """Positions start..end of one sequence, as llama.cpp serialises a sequence's KV cells: one
    prefix-cache block."""

    data: ctypes.Array
    start: int
    end: int


class CellCopies:
    """The prefix cache's storage on llama.cpp (prefix_cache.Storage): a block is a copy of its
    KV cells in host memory, as llama.cpp saves a sequence's state, made and restored through a
    scratch sequence no row uses.

    Copies, not cells held in the context: cells kept for the cache would sit among the rows'
    cells, so a row's cells would land in another order from one request to the next, and
    attention sums its positions in the order of their cells (the last bits of a seeded answer
    would then depend on what was cached before). They would also take window and sequences
    from running rows."""

    def __init__(self, lib, ctx, memory, scratch: int):
        self.lib, self.ctx, self.memory, self.scratch = lib, ctx, memory, scratch

    # prefix_cache.Storage ------------------------------------------------------------------
    def size(self, saved: SavedCells) -> int:
        """Bytes of the copy."""
        return ctypes.sizeof(saved.data)

    def join(self, parts: list[SavedCells]) -> list[SavedCells]:
        """A chain's copies, in order (`LlamaCppRunner.begin` restores them into its row)."""
        return list(parts)

    # what the runner asks ---------------------------------------------------------------------
    def copy(self, row_seq: int, start: int, end: int) -> SavedCells | None:
        """A copy of a row's cells at positions start..end; None when llama.cpp gave none."""
        lib, memory, scratch = self.lib, self.memory, self.scratch
        lib.llama_memory_seq_rm(memory, scratch, -1, -1)
        lib.llama_memory_seq_cp(memory, row_seq, scratch, start, end)
        try:
            size = int(lib.llama_state_seq_get_size(self.ctx, scratch))
            data = (ctypes.c_uint8 * size)()
            written = int(lib.llama_state_seq_get_data(self.ctx, data, size, scratch))
        finally:
            lib.llama_memory_seq_rm(memory, scratch, -1, -1)
        return SavedCells(data, start, end) if written == size > 0 else None

    def restore(self, chain: list[SavedCells], row_seq: int) -> int:
        """Put the chain's cells into a row's (empty) sequence, in order; how many positions were
        restored (fewer when the window has no cells left for the next block)."""
        lib, memory, scratch = self.lib, self.memory, self.scratch
        restored = 0
        for saved in chain:
            if saved.start != restored:
                break
            loaded = lib.llama_state_seq_set_data(
                self.ctx, saved.data, ctypes.sizeof(saved.data), scratch
            )
            if loaded:
                lib.llama_memory_seq_cp(memory, scratch, row_seq, -1, -1)
            lib.llama_memory_seq_rm(memory, scratch, -1, -1)
            if not loaded:
                break
            restored = saved.end
        return restored
