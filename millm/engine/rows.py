"""One row of a generation job as the decode loop holds it: its sampler's generator, its tokens,
its stops and detokenizer, its edit, reads and watches, and what it has emitted."""

from __future__ import annotations

import secrets

import torch

from millm.engine.detokenize import IncrementalDetokenizer
from millm.engine.jobs import Event, GenerationJob, RowFinished, RowSpec, TokenDrawn
from millm.engine.loader import LoadedModel
from millm.engine.reading import Capture, Reader
from millm.engine.residual import ResidualEdit, combined
from millm.engine.sampling import drawn_logprobs, next_token, penalised
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
        self.constraint = (
            lm.grammar.matcher(spec.constraint) if spec.constraint is not None else None
        )
        self.captures = [Capture(read, len(spec.prompt_ids)) for read in spec.reads]
        self.watches = [WatchState(watch, len(spec.prompt_ids)) for watch in spec.watches]
        self.readers: list[Reader] = [*self.captures, *self.watches]
        # positions fed to the model so far (the prompt, then each sampled token but the last)
        self.fed = 0
        self.cached = 0  # prompt positions taken from a prefix cache
        self._edits: dict[tuple[int, ...], ResidualEdit | None] = {(): spec.edit}

    def end_events(self) -> list[Event]:
        """What a finished row reports: each watch's verdict, each read's capture, then
        RowFinished."""
        assert self.finish_reason is not None
        tokens = list(self.spec.prompt_ids) + self.generated
        verdicts = [watch.verdict(self.index, tokens, self.fed) for watch in self.watches]
        reads = [capture.result(self.index, tokens) for capture in self.captures]
        return [
            *verdicts,
            *reads,
            RowFinished(self.index, self.finish_reason, len(self.generated), self.cached),
        ]

    def edit(self) -> ResidualEdit | None:
        """The edit of the position this row feeds next: its own, plus each steer watch steering
        there.

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

    def choose(self, logits: torch.Tensor) -> tuple[int, TokenDrawn | None]:
        """Sample this row's next token from its logits `[V]` (within its grammar, if it has one),
        with its log-probabilities when the row asks for them (never for EOS)."""
        if self.constraint is not None:
            logits = self.constraint.mask(logits)
        seen_ids = seen_counts = None
        if self.spec.sampling.penalised and self.counts:
            seen_ids = torch.tensor(list(self.counts), dtype=torch.long, device=logits.device)
            seen_counts = torch.tensor(list(self.counts.values()), device=logits.device)
        sampling = self.spec.sampling
        drawn = penalised(logits, sampling, seen_ids, seen_counts)
        token = next_token(drawn, sampling, self.generator)  # penalised once, here
        if self.spec.logprobs is None or token in self.eos:
            return token, None
        logprob, top = drawn_logprobs(drawn, sampling, token, self.spec.logprobs)
        return token, TokenDrawn(self.index, token, logprob, tuple(top))

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
        """End the row for an abort watch; return the text it still held (the trigger token's
        included)."""
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
