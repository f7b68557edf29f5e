"""Keys and values of earlier prompts (and finished generations), reused by later ones that start
the same way.

A position's keys and values depend on every token up to it *and on the residual edits made on
the way*: a steered row's KV differs from an unsteered one's from its first position on. So the
cache is keyed by token prefix *and* by the row's steering (`steering_key`: the content of its
additions and its operations' own keys), and nothing else about a request: unsteered rows share
freely, a steered row only reuses what was computed under the very same edit. The model is not
in the key because a cache belongs to one loaded model (the scheduler's) and goes with it.

Storage is in blocks of BLOCK_TOKENS positions, each the KV of its tokens for every layer, chained
to the block before it (so a block stands for its whole prefix, as vLLM's block hashes do; the
chain link is the parent's serial number, so two different prefixes can never share a block).
A budget in bytes bounds them; past it the least recently used go first. A lookup touches its
chain leaf first, so a parent is always more recently used than its children and eviction takes
leaves before the prefixes they extend.
"""

from __future__ import annotations

import hashlib
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from millm.engine.residual import Operation, ResidualEdit

BLOCK_TOKENS = 16
# The residual edit of an unsteered row.
UNSTEERED: tuple = ()
# Per KV group: keys and values `[layers, kv_heads, T, head_dim]` (as LeanRunner.row_kv gives them).
KV = list[tuple[torch.Tensor, torch.Tensor]]

_keys: weakref.WeakKeyDictionary[ResidualEdit, tuple | None] = weakref.WeakKeyDictionary()


def keyed(operation: Operation, key: Hashable) -> Operation:
    """Mark an operation with what it does, so rows with equal operations share cached KV."""
    operation.cache_key = key  # type: ignore[attr-defined]  # a function's own attribute, read by steering_key
    return operation


def digest(tensor: torch.Tensor) -> str:
    """A short content hash of a tensor (its float32 values and shape)."""
    data = tensor.detach().float().cpu().contiguous()
    return hashlib.blake2b(
        data.numpy().tobytes() + str(tuple(data.shape)).encode(), digest_size=16
    ).hexdigest()


def steering_key(edit: ResidualEdit | None) -> tuple | None:
    """What a row's KV depends on besides its tokens: UNSTEERED, the edit's content, or None when
    an operation of it carries no `cache_key` (its rows are then never cached)."""
    if edit is None:
        return UNSTEERED
    if edit in _keys:
        return _keys[edit]
    operations = []
    for point, operation in edit.operations:
        key = getattr(operation, "cache_key", None)
        if key is None:
            _keys[edit] = None
            return None
        operations.append((point, key))
    found = (tuple((point, digest(vector)) for point, vector in edit.additions), tuple(operations))
    _keys[edit] = found
    return found


class Storage(Protocol):
    """How a runner keeps a block's KV: torch tensors (the lean runner), or llama.cpp's saved
    state of the block's cells (llamacpp_sequences.CellCopies)."""

    def size(self, kv: Any) -> int:
        """Bytes a block's KV holds."""
        ...

    def join(self, parts: list[Any]) -> Any:
        """A chain's KV, in order, as the runner's `begin` takes it."""
        ...


class TensorStorage:
    """Blocks as tensors `[layers, kv_heads, T, head_dim]` per KV group, copies of a row's
    buffer."""

    def size(self, kv: KV) -> int:
        """Bytes of the block's keys and values."""
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)

    def join(self, parts: list[KV]) -> KV:
        """The chain's KV joined along positions, per group."""
        return [
            (
                torch.cat([kv[g][0] for kv in parts], dim=2),
                torch.cat([kv[g][1] for kv in parts], dim=2),
            )
            for g in range(len(parts[0]))
        ]


def cache_for(runner: Any, budget: int) -> PrefixCache | None:
    """A prefix cache over the runner's storage (`prefix_storage`), or None where the runner
    cannot restore a prefix or the budget is 0."""
    storage = getattr(runner, "prefix_storage", None)
    return PrefixCache(budget, storage=storage) if storage is not None and budget > 0 else None


@dataclass(eq=False)
class Block:
    """The KV of BLOCK_TOKENS positions that follow the prefix `parent` stands for."""

    serial: int
    parent: Block | None
    index: tuple  # (parent serial, steering key, tokens): its entry in the cache
    kv: Any  # as the storage keeps it
    size: int  # bytes
    children: set[int] = field(default_factory=set)


@dataclass
class Counters:
    """What the cache has done since the model loaded."""

    lookups: int = 0  # prefills that looked (one per distinct prompt and steering)
    hits: int = 0  # of them, those that reused at least one position
    tokens_reused: int = 0
    tokens_stored: int = 0
    evictions: int = 0  # blocks dropped for the budget


class PrefixCache:
    """KV blocks by (prefix, steering), under a byte budget, least recently used evicted first.

    Used only on the scheduler thread; `snapshot` may be read from any thread."""

    def __init__(
        self, budget: int, block_tokens: int = BLOCK_TOKENS, storage: Storage | None = None
    ):
        self.budget, self.block_tokens = budget, block_tokens
        self.storage: Storage = storage if storage is not None else TensorStorage()
        self._entries: dict[tuple, Block] = {}
        # serial -> block, least recently used first
        self._lru: OrderedDict[int, Block] = OrderedDict()
        self._serial = 0
        self.bytes = 0
        self.counters = Counters()

    def lookup(self, tokens: Sequence[int], steering: tuple, limit: int) -> list[Block]:
        """The chain of cached blocks covering the longest stored prefix of tokens[:limit],
        touched."""
        chain: list[Block] = []
        step = self.block_tokens
        for start in range(0, limit - step + 1, step):
            found = self._entries.get(
                (chain[-1].serial if chain else 0, steering, tuple(tokens[start : start + step]))
            )
            if found is None:
                break
            chain.append(found)
        for block in reversed(chain):  # leaf first: its parents end up the more recently used
            self._lru.move_to_end(block.serial)
        self.counters.lookups += 1
        return chain

    def record(self, reused: int) -> None:
        """Count a row that took `reused` positions from the cache (0: a miss)."""
        self.counters.hits += reused > 0
        self.counters.tokens_reused += reused

    def restore(self, chain: list[Block]) -> Any:
        """The chain's KV, as the runner's `begin` takes it."""
        return self.storage.join([block.kv for block in chain])

    def store(
        self, tokens: Sequence[int], steering: tuple, kv_of: Callable[[int, int], Any]
    ) -> None:
        """Store every whole block of `tokens` not yet cached; `kv_of(start, end)` copies a span's
        KV (None: not available, and nothing from there on is stored). Then evict down to the
        budget."""
        parent: Block | None = None
        chain = []
        step = self.block_tokens
        for start in range(0, len(tokens) - step + 1, step):
            index = (parent.serial if parent else 0, steering, tuple(tokens[start : start + step]))
            block = self._entries.get(index)
            if block is None:
                kv = kv_of(start, start + step)
                if kv is None:
                    break
                self._serial += 1
                size = self.storage.size(kv)
                block = Block(self._serial, parent, index, kv, size)
                self._entries[index] = block
                self._lru[block.serial] = block
                if parent is not None:
                    parent.children.add(block.serial)
                self.bytes += size
                self.counters.tokens_stored += step
            chain.append(block)
            parent = block
        for block in reversed(chain):
            self._lru.move_to_end(block.serial)
        self._evict()

    def _evict(self) -> None:
        while self.bytes > self.budget and self._lru:
            self._drop(next(iter(self._lru.values())))

    def _drop(self, block: Block) -> None:
        for serial in list(
            block.children
        ):  # a child of a dropped block could never be reached again
            child = self._lru.get(serial)
            if child is not None:
                self._drop(child)
        del self._entries[block.index]
        del self._lru[block.serial]
        if block.parent is not None:
            block.parent.children.discard(block.serial)
        self.bytes -= block.size
        self.counters.evictions += 1

    def snapshot(self) -> dict:
        """Counters, bytes held and the budget, for /api/health/inference."""
        c = self.counters
        return {
            "budget_bytes": self.budget,
            "bytes": self.bytes,
            "blocks": len(self._lru),
            "block_tokens": self.block_tokens,
            "lookups": c.lookups,
            "hits": c.hits,
            "tokens_reused": c.tokens_reused,
            "tokens_stored": c.tokens_stored,
            "evictions": c.evictions,
        }
