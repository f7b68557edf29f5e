"""The decode loop: prefill, then sample / detokenise / stop-check / step until every row is done.

Small named steps in the style of gpt-fast's generate.py. The loop works on a list of row
states and a KVBatch, not on a request, so rows of different requests can share it later.
"""

from __future__ import annotations

import secrets

import torch

from millm.engine.detokenize import IncrementalDetokenizer
from millm.engine.jobs import GenerationJob, ResidualsRead, RowFinished, RowSpec, TextDelta
from millm.engine.loader import LoadedModel
from millm.engine.reading import Capture, taps
from millm.engine.residual import Stacked
from millm.engine.sampling import next_token
from millm.engine.stopping import StopMatcher


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
        self.fed = 0  # positions fed to the model so far (the prompt, then each sampled token but the last)

    def read_results(self) -> list[ResidualsRead]:
        """What this row's reads captured, once it has finished."""
        tokens = list(self.spec.prompt_ids) + self.generated
        return [capture.result(self.index, tokens) for capture in self.captures]

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
    if any(row.captures for row in rows):  # rows sharing a prefill share what it reads
        shared: list[list[Capture]] = [[] for _ in firsts]
        for row in rows:
            shared[distinct[(row.spec.prompt_ids, id(row.spec.edit))]].extend(row.captures)
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
        self.edits: Stacked | None = None
        self.reading = False
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
        self._restack()

    def reset(self) -> None:
        """Drop every row (after a failure the lane starts empty)."""
        self.rows, self.batch, self.logits, self.edits, self.open = [], None, None, None, {}

    def _restack(self) -> None:
        self.edits = self.lm.residual.stack([row.spec.edit for row in self.rows])
        self.reading = any(row.captures for row in self.rows)

    def step(self) -> list[tuple[GenerationJob, str]]:
        """Sample one token for every row, emit, drop finished and cancelled rows, run the next
        forward pass; returns the jobs that ended in this step, each `served` or `cancelled`."""
        ended = [(job, "cancelled") for job in self.open if job.cancelled.is_set()]
        tokens = []
        for i, row in enumerate(self.rows):
            if row.job.cancelled.is_set():
                tokens.append(-1)
                continue
            assert self.logits is not None  # a lane with rows holds their logits
            token = row.choose(self.logits[i])
            tokens.append(token)
            text = row.accept(token)
            if text:
                row.job.emit(TextDelta(row.index, text))
            if row.finish_reason is not None:
                for read in row.read_results():
                    row.job.emit(read)
                row.job.emit(RowFinished(row.index, row.finish_reason, len(row.generated)))
                self.open[row.job] -= 1
                if self.open[row.job] == 0:
                    ended.append((row.job, "served"))
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
            self._restack()
        readers = taps([(row.captures, row.fed, 1) for row in self.rows]) if self.reading else None
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
