"""The decode loop: prefill, then sample / detokenise / stop-check / step until every row is done.

Small named steps in the style of gpt-fast's generate.py. The loop works on a list of row
states and a KVBatch, not on a request, so rows of different requests can share it later.
"""

from __future__ import annotations

import secrets
from typing import Any

import torch

from millm.engine.detokenize import IncrementalDetokenizer
from millm.engine.jobs import Event, GenerationJob, RowFinished, RowSpec, TextDelta
from millm.engine.loader import LoadedModel
from millm.engine.reading import Capture, Reader, taps
from millm.engine.residual import ResidualEdit, combined
from millm.engine.sampling import next_token
from millm.engine.stopping import StopMatcher
from millm.engine.watching import WatchState


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A row's own random stream: seeded when asked, otherwise from the OS's entropy."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else secrets.randbits(63))
    return generator


class RowState:
    """One row's progress: tokens so far, text decoding, stop matching, penalties' counts."""

    def __init__(self, index: int, spec: RowSpec, lm: LoadedModel, job: GenerationJob):
        self.index = index
        self.spec = spec
        self.job = job
        self.eos = lm.eos_token_ids
        self.generator = make_generator(spec.seed, lm.device)
        self.detokenizer = IncrementalDetokenizer(lm.tokenizer, list(spec.prompt_ids))
        self.stopper = StopMatcher(spec.stop)
        self.generated: list[int] = []
        self.counts: dict[int, int] = {}
        self.finish_reason: str | None = None
        self.constraint = lm.grammar.matcher(spec.constraint) if spec.constraint is not None else None
        self.captures = [Capture(read, len(spec.prompt_ids)) for read in spec.reads]
        self.watches = [WatchState(watch, len(spec.prompt_ids)) for watch in spec.watches]
        self.readers: list[Reader] = [*self.captures, *self.watches]
        self.fed = 0  # positions fed to the model so far (the prompt, then each sampled token but the last)
        self._edits: dict[tuple[int, ...], ResidualEdit | None] = {(): spec.edit}

    def end_events(self) -> list[Event]:
        """What a finished row reports: each watch's verdict, each read's capture, then RowFinished."""
        assert self.finish_reason is not None
        tokens = list(self.spec.prompt_ids) + self.generated
        verdicts = [watch.verdict(self.index, tokens, self.fed) for watch in self.watches]
        reads = [capture.result(self.index, tokens) for capture in self.captures]
        return [*verdicts, *reads, RowFinished(self.index, self.finish_reason, len(self.generated))]

    def edit(self) -> ResidualEdit | None:
        """The edit of the position this row feeds next: its own, plus each steer watch steering there.

        The same combination is the same object every time, so a lane restacks only on a change."""
        if not self.watches:
            return self.spec.edit
        active = tuple(i for i, watch in enumerate(self.watches) if watch.steers(self.fed))
        if active not in self._edits:
            edit = self.spec.edit
            for i in active:
                edit = combined(edit, self.watches[i].watch.edit)
            self._edits[active] = edit
        return self._edits[active]

    @property
    def aborted(self) -> bool:
        """Whether an abort watch fired: the row ends before sampling again."""
        return any(watch.aborts for watch in self.watches)

    def choose(self, logits: torch.Tensor) -> int:
        """Sample this row's next token from its logits `[V]` (within its grammar, if it has one)."""
        if self.constraint is not None:
            logits = self.constraint.mask(logits)
        seen_ids = seen_counts = None
        if self.spec.sampling.penalised and self.counts:
            seen_ids = torch.tensor(list(self.counts), dtype=torch.long, device=logits.device)
            seen_counts = torch.tensor(list(self.counts.values()), device=logits.device)
        return next_token(logits, self.spec.sampling, self.generator, seen_ids, seen_counts)

    def accept(self, token: int) -> str:
        """Record a sampled token; return the text it releases and set finish_reason when done."""
        self.generated.append(token)
        self.counts[token] = self.counts.get(token, 0) + 1
        if self.constraint is not None:
            self.constraint.advance(token)
        if token in self.eos:
            return self._finish("stop")
        text = self.stopper.push(self.detokenizer.push(token))
        if self.stopper.matched is not None:
            self.finish_reason = "stop"
            return text
        if self.constraint is not None and self.constraint.finished:
            return text + self._finish("stop")  # the document is closed: only EOS could follow
        if len(self.generated) >= self.spec.max_tokens:
            return text + self._finish("length")
        return text

    def abort(self) -> str:
        """End the row for an abort watch; return the text it still held (the trigger token's included)."""
        text = self.stopper.push(self.detokenizer.flush())
        if self.stopper.matched is None:
            text += self.stopper.flush()
        self.finish_reason = "content_filter"
        return text

    def _finish(self, reason: str) -> str:
        # Whatever the detokenizer still holds may itself complete a stop string.
        text = self.stopper.push(self.detokenizer.flush())
        if self.stopper.matched is not None:
            self.finish_reason = "stop"
            return text
        self.finish_reason = reason
        return text + self.stopper.flush()


def prefill_rows(lm: LoadedModel, rows: list[RowState]):
    """Prefill each distinct (prompt, steering) once, then give every row (n choices share one) its copy."""
    distinct: dict[tuple, int] = {}
    firsts: list[RowState] = []
    for row in rows:
        key = (row.spec.prompt_ids, id(row.spec.edit))
        if key not in distinct:
            distinct[key] = len(distinct)
            firsts.append(row)
    capacity = max(len(r.spec.prompt_ids) for r in firsts) + max(row.spec.max_tokens for row in rows)
    readers = None
    if any(row.readers for row in rows):  # rows sharing a prefill share what it reads; each keeps its own
        shared: list[list[Reader]] = [[] for _ in firsts]
        for row in rows:
            shared[distinct[(row.spec.prompt_ids, id(row.spec.edit))]].extend(row.readers)
        readers = taps([(shared[i], 0, len(r.spec.prompt_ids)) for i, r in enumerate(firsts)])
    lm.residual.install(lm.residual.stack([r.spec.edit for r in firsts]), readers, [len(r.spec.prompt_ids) for r in firsts])
    batch, logits = lm.runner.prefill([list(r.spec.prompt_ids) for r in firsts], capacity)
    for row in rows:
        row.fed = len(row.spec.prompt_ids)
    order = [distinct[(row.spec.prompt_ids, id(row.spec.edit))] for row in rows]
    if order != list(range(len(distinct))):
        lm.runner.select_rows(batch, order)
        logits = logits[torch.tensor(order, device=logits.device)]
    return batch, logits


class Lane:
    """Rows stepping together over one KV batch; jobs join after their own prefill and leave when done.

    Run serially, a lane holds one job's rows. Under continuous batching the scheduler keeps one
    lane for all batched jobs: jobs that arrive between two steps are prefilled together, apart
    from the running rows (a prompt never waits for other rows' generation), then their cache is
    merged into the lane's, left-padded to a common length. Each row keeps its own sampler, stop matcher, grammar and residual edit, so rows of
    different requests with different parameters and steering share one forward pass.
    """

    def __init__(self, lm: LoadedModel):
        self.lm = lm
        self.rows: list[RowState] = []
        self.batch = None
        self.logits: torch.Tensor | None = None
        self.edits: Any = None  # the editor's stack of the rows' edits
        self.stacked: list[ResidualEdit | None] = []  # the rows' edits that `edits` stacks
        self.reading = False
        self.watching = False
        self.open: dict[GenerationJob, int] = {}  # job -> rows still generating

    @property
    def jobs(self) -> list[GenerationJob]:
        """Jobs with rows still in the lane."""
        return list(self.open)

    def join(self, *jobs: GenerationJob) -> None:
        """Prefill the jobs' rows (together, in one forward pass) and add them to the lane."""
        rows = [RowState(i, spec, self.lm, job) for job in jobs for i, spec in enumerate(job.rows)]
        batch, logits = prefill_rows(self.lm, rows)
        if self.batch is None:
            self.batch, self.logits, self.rows = batch, logits, rows
        else:
            room = max(r.spec.max_tokens - len(r.generated) for r in self.rows + rows) + 1
            self.batch = self.lm.runner.merge(self.batch, batch, room)
            self.logits = torch.cat([self.logits, logits])
            self.rows = self.rows + rows
        for job in jobs:
            self.open[job] = len(job.rows)
        self._restack([row.edit() for row in self.rows])

    def reset(self) -> None:
        """Drop every row (after a failure the lane starts empty)."""
        self.rows, self.batch, self.logits, self.edits, self.stacked, self.open = [], None, None, None, [], {}

    def _restack(self, edits: list[ResidualEdit | None]) -> None:
        self.stacked = edits
        self.edits = self.lm.residual.stack(edits)
        self.reading = any(row.readers for row in self.rows)
        self.watching = any(row.watches for row in self.rows)

    def _finish(self, row: RowState, ended: list[tuple[GenerationJob, str]]) -> None:
        for event in row.end_events():
            row.job.emit(event)
        self.open[row.job] -= 1
        if self.open[row.job] == 0:
            ended.append((row.job, "served"))

    def step(self) -> list[tuple[GenerationJob, str]]:
        """Sample one token for every row, emit, drop finished and cancelled rows, run the next
        forward pass; returns the jobs that ended in this step, each `served` or `cancelled`."""
        ended = [(job, "cancelled") for job in self.open if job.cancelled.is_set()]
        tokens = []
        for i, row in enumerate(self.rows):
            if row.job.cancelled.is_set():
                tokens.append(-1)
                continue
            if row.aborted:  # a watch fired during the last forward pass: no token follows
                tokens.append(-1)
                text = row.abort()
            else:
                assert self.logits is not None  # a lane with rows holds their logits
                token = row.choose(self.logits[i])
                tokens.append(token)
                text = row.accept(token)
            if text:
                row.job.emit(TextDelta(row.index, text))
            if row.finish_reason is not None:
                self._finish(row, ended)
        for job, _ in ended:
            del self.open[job]
        keep = [i for i, row in enumerate(self.rows) if row.finish_reason is None and not row.job.cancelled.is_set()]
        if not keep:
            self.reset()
            return ended
        if len(keep) < len(self.rows):
            self.lm.runner.select_rows(self.batch, keep)
            self.rows = [self.rows[i] for i in keep]
            tokens = [tokens[i] for i in keep]
            self._restack([row.edit() for row in self.rows])
        elif self.watching:  # a steer watch that fired (or ran out) changes its row's edit from here
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
def run_job(lm: LoadedModel, job: GenerationJob) -> str:
    """Generate every row of the job to completion, emitting text and finish events as they happen;
    returns `served`, or `cancelled` when the client went away first."""
    try:
        lane = Lane(lm)
        lane.join(job)
        outcome = "cancelled"
        while lane.rows:
            ended = lane.step()
            if ended:
                outcome = ended[-1][1]
        return outcome
    finally:
        lm.residual.clear()
