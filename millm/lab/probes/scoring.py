"""Stateless probe scoring (POST /api/probes/score): probes scored over given inputs, as a judge
scores a transcript after the fact.

Each input is one unsteered forward pass of its own (its own admission, never packed) that reads
the residual at each probe's point, before that point's steering, and stops once every point has
been read. Nothing is recorded: no monitoring record, no verdict in any request, no change to
which probes are active. The model is held for the whole request, so every input is read by the
same model.

A probe's score at each position is the one a watch gives during generation: scored in the
shapes the engine's passes fed it (the prompt at once, then one position per step) where the
input says where its prompt ends, so an offline verdict equals the live one. Position 0 is never
scored, as in a watch. Each verdict is over a window of the input's positions: `all`, `prompt`,
`response` (both need the prompt's end), `last_user` (the last user turn's content, from
messages only); a window that cannot be scored says why instead of reading as "did not fire".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from anyio import to_thread
from pydantic import BaseModel

from millm.engine.jobs import ResidualRead, ScoresReady, ScoringJob
from millm.engine.loader import LoadedModel
from millm.engine.prompts import PARTIAL_MARK, chat_prompt_ids, completion_prompt_ids, render_chat
from millm.errors import ContextLengthExceeded, InvalidRequest, MillmError
from millm.formats.probe_documents import MAX_REQUEST_PROBES
from millm.interp.probes import SKIPPED, Scorer, served_scores, verdict_of
from millm.kernel.probes.binding import bind
from millm.kernel.probes.watches import parse_probes
from millm.lab.discovery.inputs import model_to_read
from millm.lab.probes.parts import ProbeParts
from millm.lab.probes.score_protocol import (
    InputError,
    InputResult,
    MessagesInput,
    ProbeScoreRequest,
    ProbeScores,
    ScoredProbe,
    TextInput,
    TokenInput,
    Window,
    WindowVerdict,
)
from millm.v1.serving.generation import answered

TAG = "probe-score"
Kind = Literal["token_ids", "messages", "text"]


@dataclass(frozen=True)
class Bound:
    """A probe of the request, runnable on the model."""

    scorer: Scorer
    source: Literal["saved", "inline"]


@dataclass(frozen=True)
class Prepared:
    """An input made ready: its token ids, where its prompt ends (None: unknown), and the
    positions of its last user turn's content (or why there are none), or why it failed."""

    kind: Kind
    ids: list[int]
    prompt_tokens: int | None
    last_user: tuple[int, int] | str  # [start, end) positions, or why it is not known
    error: InputError | None = None


class ProbeScoring:
    """POST /api/probes/score, and its lines in a batch (`parse` and `answer`, a batch's
    LineServer)."""

    def __init__(self, state: ProbeParts):
        self.state = state

    async def score(self, body: ProbeScoreRequest) -> ProbeScores:
        """Every probe over every input, per window (a 400 naming the input or probe that cannot
        be read; an input whose conversation cannot be rendered is an error in its result)."""
        lm = await self.state.switch.acquire(model_to_read(self.state, body.model))
        bound, skipped = await to_thread.run_sync(self._bind, lm, body)
        prepared = await to_thread.run_sync(prepare_inputs, lm, body)
        results = []
        for index, item in enumerate(prepared):
            if item.error is not None:
                results.append(failed(index, item))
                continue
            scores = await self._scores(item, bound)
            results.append(result_of(index, item, bound, scores, body))
        probes = [
            ScoredProbe(
                name=b.scorer.name,
                source=b.source,
                read_point=b.scorer.point,
                threshold=b.scorer.threshold,
            )
            for b in bound
        ]
        return ProbeScores(model=lm.name, probes=probes, skipped=skipped, results=results)

    def parse(self, body: dict) -> ProbeScoreRequest:
        """A batch line's body as the route's request."""
        return ProbeScoreRequest.model_validate(body)

    async def answer(self, body: BaseModel) -> ProbeScores:
        """A batch line's answer: the route's."""
        assert isinstance(body, ProbeScoreRequest)  # parsed by `parse`
        return await self.score(body)

    async def _scores(self, item: Prepared, bound: list[Bound]) -> list[torch.Tensor]:
        """One unsteered pass over the input, cut short once every probe's point is read: each
        probe's score per position."""

        def job(emit) -> ScoringJob:
            reads = tuple(probe_read(b.scorer, item.prompt_tokens) for b in bound)
            return ScoringJob(prompts=[item.ids], emit=emit, reads=reads, reads_only=True)

        read = await answered(self.state.switch.submit, ScoresReady, job)
        return [captured.encoded for captured in read.reads]

    def _bind(self, lm: LoadedModel, body: ProbeScoreRequest) -> tuple[list[Bound], list[dict]]:
        """The probes named (a 404 or 400 naming the one that cannot be read), or every saved
        probe that fits the model (the others skipped, with why). Blocking: a worker thread."""
        attached = dict(self.state.steering.attached)
        calibrations = self.state.calibrations
        asked = parse_probes(self.state.probes, body.probes)
        if asked:
            return [
                Bound(
                    bind(attached, calibrations, lm, a.name, a.detector, f"{a.param}.detector"),
                    "saved" if a.saved else "inline",
                )
                for a in asked
            ], []
        bound, skipped = [], []
        for row in self.state.probes.all():
            try:
                scorer = bind(
                    attached, calibrations, lm, row["name"], row["document"]["detector"], "detector"
                )
            except MillmError as exc:
                skipped.append({"name": row["name"], "reason": exc.message})
                continue
            bound.append(Bound(scorer, "saved"))
        if not bound:
            raise InvalidRequest(
                "no saved probe fits the loaded model"
                + (f" ({len(skipped)} skipped: {skipped[0]['reason']})" if skipped else "")
                + "; name probes or define them inline in `probes`",
                param="probes",
            )
        if len(bound) > MAX_REQUEST_PROBES:
            raise InvalidRequest(
                f"{len(bound)} saved probes fit the loaded model; a request scores at most "
                f"{MAX_REQUEST_PROBES}: name them in `probes`",
                param="probes",
            )
        return bound, skipped


def probe_read(scorer: Scorer, prompt_tokens: int | None) -> ResidualRead:
    """A read of every position at the probe's point, before its steering, turned into the probe's
    score per position on the scheduler thread."""

    def encode(residuals: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return served_scores(scorer, residuals, prompt_tokens).float().cpu()

    return ResidualRead(scorer.point, False, "prompt", TAG, encode=encode)


# ---- inputs -----------------------------------------------------------------------------------
def prepare_inputs(lm: LoadedModel, body: ProbeScoreRequest) -> list[Prepared]:
    """Each input's token ids and boundaries (400 naming the input that cannot be read: an id
    outside the vocabulary, a prompt longer than the input, past the context window). Blocking
    (tokenising): a worker thread."""
    prepared = []
    for index, item in enumerate(body.inputs):
        where = f"inputs[{index}]"
        if isinstance(item, TokenInput):
            ready = _tokens(lm, item, where)
        elif isinstance(item, TextInput):
            ids = completion_prompt_ids(lm.tokenizer, item.text)
            ready = Prepared("text", ids, len(ids), "text_has_no_turns")
        else:
            ready = _messages(lm, item)
        if ready.error is None and len(ready.ids) > lm.context_length:
            raise ContextLengthExceeded(
                limit=lm.context_length, prompt_tokens=len(ready.ids), max_tokens=0, param=where
            )
        prepared.append(ready)
    return prepared


def _tokens(lm: LoadedModel, item: TokenInput, where: str) -> Prepared:
    for j, token in enumerate(item.token_ids):
        if token >= lm.vocab_size:
            raise InvalidRequest(
                f"{where}.token_ids[{j}] is {token}, outside the vocabulary "
                f"(0..{lm.vocab_size - 1})",
                param=f"{where}.token_ids[{j}]",
            )
    if item.prompt_tokens is not None and item.prompt_tokens > len(item.token_ids):
        raise InvalidRequest(
            f"{where}.prompt_tokens is {item.prompt_tokens}, past the input's "
            f"{len(item.token_ids)} tokens",
            param=f"{where}.prompt_tokens",
        )
    return Prepared(
        "token_ids", list(item.token_ids), item.prompt_tokens, "token_ids_have_no_turns"
    )


def _messages(lm: LoadedModel, item: MessagesInput) -> Prepared:
    """A conversation rendered as a chat request's is; ending in an assistant turn, the turns
    before it (with the generation prompt) are the prompt, when their tokens start the whole's."""
    tokenizer = lm.tokenizer
    messages = [message.model_dump() for message in item.messages]
    try:
        ids = chat_prompt_ids(tokenizer, messages)
        prompt: int | None = len(ids)
        if messages[-1]["role"] == "assistant":
            prompt = None
            if len(messages) > 1:
                head = chat_prompt_ids(tokenizer, messages[:-1])
                prompt = len(head) if ids[: len(head)] == head else None
        span = last_user_span(tokenizer, messages, ids)
    except InvalidRequest as exc:  # the chat template refused the conversation
        return Prepared(
            "messages", [], None, "", InputError(code="tokenization_failed", message=exc.message)
        )
    return Prepared("messages", ids, prompt, span)


def last_user_span(tokenizer, messages: list[dict], ids: list[int]) -> tuple[int, int] | str:
    """Positions [start, end) of the last user turn's content in the rendered conversation, or why
    they cannot be told."""
    users = [i for i, message in enumerate(messages) if message["role"] == "user"]
    if not users:
        return "no_user_turn"
    last = users[-1]
    content = messages[last]["content"]
    text = render_chat(tokenizer, messages)
    # The turns up to the last user's, its content marked: the text before the mark is the
    # text before that content in the whole render.
    marked = [*messages[:last], {**messages[last], "content": PARTIAL_MARK}]
    start = render_chat(tokenizer, marked).find(PARTIAL_MARK)
    if not content or start < 0 or text[start : start + len(content)] != content:
        return "last_user_unknown"
    if not getattr(tokenizer, "is_fast", False):
        return "last_user_unknown"  # no character offsets to map the text to tokens
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(encoded["input_ids"]) != ids:
        return "last_user_unknown"
    end = start + len(content)
    inside = [
        p for p, (a, b) in enumerate(encoded["offset_mapping"]) if b > a and a >= start and b <= end
    ]
    return (inside[0], inside[-1] + 1) if inside else "last_user_unknown"


# ---- verdicts ---------------------------------------------------------------------------------
def window_positions(window: Window, item: Prepared) -> range | str:
    """The positions a window covers (position 0 never), or why it cannot be scored."""
    n, prompt = len(item.ids), item.prompt_tokens
    if window == "all":
        return range(SKIPPED, n)
    if window == "last_user":
        if isinstance(item.last_user, str):
            return item.last_user
        return range(max(SKIPPED, item.last_user[0]), item.last_user[1])
    if prompt is None:
        return "prompt_boundary_unknown"
    return range(SKIPPED, prompt) if window == "prompt" else range(max(SKIPPED, prompt), n)


def result_of(
    index: int,
    item: Prepared,
    bound: list[Bound],
    scores: list[torch.Tensor],
    body: ProbeScoreRequest,
) -> InputResult:
    """One input's verdicts: each probe over each window asked for."""
    verdicts = []
    for probe, score in zip(bound, scores, strict=True):
        for window in dict.fromkeys(body.windows):
            verdicts.append(window_verdict(probe.scorer, window, item, score))
    return InputResult(
        index=index,
        input_kind=item.kind,
        n_tokens=len(item.ids),
        prompt_tokens=item.prompt_tokens,
        token_ids=item.ids if body.return_token_ids else None,
        verdicts=verdicts,
    )


def failed(index: int, item: Prepared) -> InputResult:
    """An input that could not be read: its error, no verdicts."""
    return InputResult(
        index=index,
        input_kind=item.kind,
        n_tokens=None,
        prompt_tokens=None,
        verdicts=[],
        error=item.error,
    )


def window_verdict(
    scorer: Scorer, window: Window, item: Prepared, scores: torch.Tensor
) -> WindowVerdict:
    """A probe over one window of an input's positions."""
    covered = window_positions(window, item)
    if isinstance(covered, str) or len(covered) == 0:
        reason = covered if isinstance(covered, str) else "window_empty"
        return WindowVerdict(probe=scorer.name, window=window, fired=None, peak=None,
                             peak_position=None, first_position=None, positions=[],
                             threshold=scorer.threshold, span=None, scored_positions=0,
                             not_scored_reason=reason)  # fmt: skip
    positions = tuple(covered)
    verdict = verdict_of(
        scores[covered.start : covered.stop],
        scorer.threshold,
        positions,
        tuple(item.ids[p] for p in positions),
    )
    return WindowVerdict(
        probe=scorer.name,
        window=window,
        fired=verdict.fired,
        peak=verdict.peak,
        peak_position=verdict.peak_position,
        first_position=verdict.first_position,
        positions=list(verdict.positions),
        threshold=scorer.threshold,
        span=(covered.start, covered.stop),
        scored_positions=len(positions),
    )
