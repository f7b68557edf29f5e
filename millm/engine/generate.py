"""The decode loop: prefill, then sample / detokenise / stop-check / step until every row is done.

Small named steps in the style of gpt-fast's generate.py. The loop works on a list of row
states and a KVBatch, not on a request, so rows of different requests can share it later.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch

from millm.engine.jobs import GenerationJob, RowSpec, TextDelta
from millm.engine.kv_cache import RowKV
from millm.engine.loader import LoadedModel
from millm.engine.prefix_cache import PrefixCache, steering_key
from millm.engine.reading import Reader, taps
from millm.engine.residual import ResidualEdit
from millm.engine.rows import RowState
from millm.engine.runners import advance_prefill, begin_prefill


def reusable(spec: RowSpec, exact: bool) -> int:
    """How many of a row's first prompt positions may come from a prefix cache: never the last
    (its logits are needed), none a read wants, none for a watched row (a probe scores every
    position), and none for a seeded row unless the model computes in float32, where a restored
    prefix gives the very tokens of a recomputed one (in bf16 arithmetic depends on shape)."""
    if spec.watches or (spec.seed is not None and not exact):
        return 0
    return min(
        [
            len(spec.prompt_ids) - 1,
            *(read.first_position(len(spec.prompt_ids)) for read in spec.reads),
        ]
    )


class Joining:
    """Jobs joining a lane: their rows, and the one prefill they share, run a chunk at a time.

    Each distinct (prompt, steering) is prefilled once and every row (n choices share one) gets
    its copy. With a prefix cache, a prefill first takes what the cache holds of its prompt under
    its steering, and when done gives the cache its whole blocks."""

    def __init__(self, lm: LoadedModel, cache: PrefixCache | None, jobs: tuple[GenerationJob, ...]):
        self.lm, self.cache, self.jobs = lm, cache, jobs
        self.rows = [RowState(i, spec, lm, job) for job in jobs for i, spec in enumerate(job.rows)]
        distinct: dict[tuple, int] = {}
        self.firsts: list[RowState] = []
        for row in self.rows:
            key = (row.spec.prompt_ids, id(row.spec.edit))
            if key not in distinct:
                distinct[key] = len(distinct)
                self.firsts.append(row)
        self.order = [distinct[(row.spec.prompt_ids, id(row.spec.edit))] for row in self.rows]
        # rows sharing a prefill share what it reads
        self.readers: list[Sequence[Reader]] = [[] for _ in self.firsts]
        limits = [len(first.spec.prompt_ids) - 1 for first in self.firsts]
        exact = lm.restores_exactly
        for row, i in zip(self.rows, self.order, strict=True):
            self.readers[i] = [*self.readers[i], *row.readers]
            limits[i] = min(limits[i], reusable(row.spec, exact))
        self.steering = [steering_key(first.spec.edit) for first in self.firsts]
        prompts = [list(first.spec.prompt_ids) for first in self.firsts]
        capacity = max(map(len, prompts)) + max(row.spec.max_tokens for row in self.rows)
        self.prefill = begin_prefill(lm.runner, prompts, capacity, self._restored(prompts, limits))
        for row, i in zip(self.rows, self.order, strict=True):
            row.fed = len(row.spec.prompt_ids)
            row.cached = self.prefill.reused[i]
        if cache is not None:
            for i, steering in enumerate(self.steering):
                if steering is not None:
                    cache.record(self.prefill.reused[i])
        self.edits = lm.residual.stack([first.spec.edit for first in self.firsts])

    def _restored(self, prompts: list[list[int]], limits: list[int]) -> list[RowKV | None] | None:
        if self.cache is None:
            return None
        restored: list[RowKV | None] = []
        for prompt, key, limit in zip(prompts, self.steering, limits, strict=True):
            chain = self.cache.lookup(prompt, key, limit) if key is not None and limit > 0 else []
            restored.append(self.cache.restore(chain) if chain else None)
        return restored

    def advance(self, tokens: int | None) -> tuple[Any, torch.Tensor] | None:
        """Prefill the next `tokens` columns (None, or a runner without chunks: the rest); when
        done, store the prompts' blocks and return the joining batch with every row's logits
        `[rows, V]`."""
        prefill = self.prefill
        start, end = prefill.done, prefill.span(tokens)
        # each row's first column in this chunk
        firsts = [max(start, prefill.width - n) for n in prefill.lengths]
        real = [max(0, end - first) for first in firsts]
        readers = None
        if any(self.readers):
            readers = taps(
                [
                    (wanted, first - (prefill.width - n), count)
                    for wanted, first, n, count in zip(
                        self.readers, firsts, prefill.lengths, real, strict=True
                    )
                ]
            )
        self.lm.residual.install(self.edits, readers, real)
        logits = advance_prefill(self.lm.runner, prefill, end - start)
        if logits is None:
            return None
        self._store()
        batch = prefill.batch
        if self.order != list(range(len(self.firsts))):
            self.lm.runner.select_rows(batch, self.order)
            logits = logits[torch.tensor(self.order, device=logits.device)]
        return batch, logits

    def _store(self) -> None:
        if self.cache is None:
            return
        runner = self.lm.runner
        for i, (first, key) in enumerate(zip(self.firsts, self.steering, strict=True)):
            if key is not None:
                # a cache exists only beside a chunked runner, which has row_kv
                row_kv = partial(runner.row_kv, self.prefill.batch, i)  # type: ignore[attr-defined]
                self.cache.store(first.spec.prompt_ids, key, row_kv)


class Lane:
    """Rows stepping together over one KV batch; jobs join after their own prefill and leave when
    done.

    Run serially, a lane holds one job's rows. Under continuous batching the scheduler keeps one
    lane for all batched jobs: jobs that arrive between two steps are admitted together and
    prefilled apart from the running rows (a prompt never waits for other rows' generation), a
    chunk between two steps when rows are running (so they keep flowing), then their cache is
    merged into the lane's, left-padded to a common length. Each row keeps its own sampler, stop
    matcher, grammar and residual edit, so rows of different requests with different parameters
    and steering share one forward pass.
    """

    def __init__(self, lm: LoadedModel, cache: PrefixCache | None = None):
        self.lm, self.cache = lm, cache
        self.rows: list[RowState] = []
        self.batch = None
        self.logits: torch.Tensor | None = None
        self.edits: Any = None  # the editor's stack of the rows' edits
        self.stacked: list[ResidualEdit | None] = []  # the rows' edits that `edits` stacks
        self.reading = False
        self.watching = False
        self.open: dict[GenerationJob, int] = {}  # job -> rows still generating
        self.joining: Joining | None = None

    @property
    def jobs(self) -> list[GenerationJob]:
        """Jobs with rows still in the lane."""
        return list(self.open)

    def admit(self, *jobs: GenerationJob) -> None:
        """Start the jobs' prefill (what a prefix cache holds of it is restored now, the rest is
        computed by `advance`); one joining set at a time."""
        assert self.joining is None, "a lane admits the next jobs once the last ones have joined"
        self.joining = Joining(self.lm, self.cache, jobs)

    def advance(self, tokens: int | None = None) -> list[tuple[GenerationJob, str]]:
        """Prefill the next `tokens` columns of the joining jobs (None: all); once done they join
        the running rows. Returns the joining jobs that ended: all of them `cancelled` when every
        one was cancelled before its prefill finished."""
        joining = self.joining
        assert joining is not None, "advance follows admit"
        if all(job.cancelled.is_set() for job in joining.jobs):
            self.joining = None
            return [(job, "cancelled") for job in joining.jobs]
        done = joining.advance(tokens)
        if done is None:
            return []
        self.joining = None
        batch, logits = done
        rows = joining.rows
        if self.batch is None:
            self.batch, self.logits, self.rows = batch, logits, rows
        else:
            room = max(r.spec.max_tokens - len(r.generated) for r in self.rows + rows) + 1
            self.batch = self.lm.runner.merge(self.batch, batch, room)
            self.logits = torch.cat([self.logits, logits])
            self.rows = self.rows + rows
        for job in joining.jobs:
            self.open[job] = len(job.rows)
        self._restack([row.edit() for row in self.rows])
        return []

    def join(self, *jobs: GenerationJob) -> None:
        """Prefill the jobs' rows (together, in one pass) and add them to the lane."""
        self.admit(*jobs)
        while self.joining is not None:
            self.advance()

    def reset(self) -> None:
        """Drop every running row (after a failure the lane starts empty; a joining set is not
        touched)."""
        self.rows, self.batch, self.logits, self.edits, self.stacked, self.open = (
            [],
            None,
            None,
            None,
            [],
            {},
        )

    def _restack(self, edits: list[ResidualEdit | None]) -> None:
        self.stacked = edits
        self.edits = self.lm.residual.stack(edits)
        self.reading = any(row.readers for row in self.rows)
        self.watching = any(row.watches for row in self.rows)

    def _finish(self, i: int, row: RowState, ended: list[tuple[GenerationJob, str]]) -> None:
        self._remember(i, row)
        for event in row.end_events():
            row.job.emit(event)
        self.open[row.job] -= 1
        if self.open[row.job] == 0:
            ended.append((row.job, "served"))

    def _remember(self, i: int, row: RowState) -> None:
        """Give the prefix cache a finished row's prompt and answer (all it fed), so the next turn
        of its conversation reuses both; not a watched row, whose steering may have changed
        midway."""
        if self.cache is None or row.watches:
            return
        key = steering_key(row.spec.edit)
        if key is not None:
            tokens = (list(row.spec.prompt_ids) + row.generated)[: row.fed]
            self.cache.store(tokens, key, partial(self.lm.runner.row_kv, self.batch, i))  # type: ignore[attr-defined]  # a cache exists only beside a chunked runner

    def step(self) -> list[tuple[GenerationJob, str]]:
        """Sample one token for every row, emit, drop finished and cancelled rows, run the next
        forward pass; returns the jobs that ended in this step, each `served` or `cancelled`."""
        # Read once: a client may cancel while this step runs, and a job whose rows are dropped
        # here must also be reported as ended here (else it is never counted and stays open).
        cancelled = {job for job in self.open if job.cancelled.is_set()}
        ended = [(job, "cancelled") for job in cancelled]
        tokens = []
        for i, row in enumerate(self.rows):
            if row.job in cancelled:
                tokens.append(-1)
                continue
            if row.aborted:  # a watch fired during the last forward pass: no token follows
                tokens.append(-1)
                text = row.abort()
            else:
                assert self.logits is not None  # a lane with rows holds their logits
                token, drawn = row.choose(self.logits[i])
                tokens.append(token)
                if drawn is not None:
                    row.job.emit(drawn)
                text = row.accept(token)
            if text:
                row.job.emit(TextDelta(row.index, text))
            if row.finish_reason is not None:
                self._finish(i, row, ended)
        for job, _ in ended:
            del self.open[job]
        keep = [
            i
            for i, row in enumerate(self.rows)
            if row.finish_reason is None and row.job not in cancelled
        ]
        if not keep:
            self.reset()
            return ended
        if len(keep) < len(self.rows):
            self.lm.runner.select_rows(self.batch, keep)
            self.rows = [self.rows[i] for i in keep]
            tokens = [tokens[i] for i in keep]
            self._restack([row.edit() for row in self.rows])
        elif (
            self.watching
        ):  # a steer watch that fired (or ran out) changes its row's edit from here
            edits = [row.edit() for row in self.rows]
            if any(new is not old for new, old in zip(edits, self.stacked, strict=True)):
                self._restack(edits)
        readers = taps([(row.readers, row.fed, 1) for row in self.rows]) if self.reading else None
        self.lm.residual.install(self.edits, readers)
        self.logits = self.lm.runner.step(self.batch, torch.tensor(tokens, device=self.lm.device))
        for row in self.rows:
            row.fed += 1
        return ended


@torch.inference_mode()
def run_job(lm: LoadedModel, job: GenerationJob, cache: PrefixCache | None = None) -> str:
    """Generate every row of the job to completion, emitting text and finish events as they happen;
    returns `served`, or `cancelled` when the client went away first."""
    try:
        lane = Lane(lm, cache)
        lane.join(job)
        outcome = "cancelled"
        while lane.rows:
            ended = lane.step()
            if ended:
                outcome = ended[-1][1]
        return outcome
    finally:
        lm.residual.clear()
