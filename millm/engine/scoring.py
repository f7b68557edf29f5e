"""Scoring mode: the next-token distribution of a prompt, from one unsteered forward pass.

`score` is pure over a logits vector: temperature divides the logits (0 = no scaling), the
log-probabilities are normalised over the allowed ids only (or the whole vocabulary), and non-finite
values that would reach the answer are refused rather than reported. With echo, the same pass also
scores the prompt's own tokens (`echo_scores`), as OpenAI's legacy `echo` does. It runs on the
scheduler thread, beside the forward pass, and turns only the candidates asked for into Python
numbers: a whole vocabulary as a Python list cost tens of milliseconds wherever it ran.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from functools import partial

import torch

from millm.engine.jobs import Ranking, ResidualsRead, ScoresReady, ScoringJob
from millm.engine.loader import LoadedModel
from millm.engine.paused import Steps, drained, resumed
from millm.engine.prefix_cache import KV, UNSTEERED, PrefixCache
from millm.engine.reading import Capture, taps
from millm.engine.residual import Tap
from millm.engine.runners import (
    advance_prefill,
    begin_prefill,
    prefill_steps,
    prompt_logits_steps,
)
from millm.errors import NonFiniteLogits

MIN_TEMPERATURE = 0.001


@dataclass(frozen=True)
class Scored:
    """The distribution's answer: the chosen id and candidates by descending log-probability."""

    chosen: int
    chosen_logprob: float
    ranked: list[tuple[int, float]]  # candidates, most probable first (the first `top` asked for)


def score(
    logits: torch.Tensor,
    allowed: list[int] | tuple[int, ...] | None,
    temperature: float,
    top: int | None = None,
) -> Scored:
    """Rank the candidates of one next-token logits vector `[V]` (float32); keep the first `top`
    (None: all)."""
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    ids = torch.tensor(allowed, dtype=torch.long) if allowed else torch.arange(logits.shape[0])
    values = logits[ids]
    if bool(torch.isnan(values).any()) or bool(torch.isposinf(values).any()):
        raise NonFiniteLogits(
            "the model produced NaN or +inf logits "
            + ("on an allowed token" if allowed else "in its next-token distribution")
        )
    logprobs = torch.log_softmax(values, dim=-1)
    order = torch.argsort(logprobs, descending=True, stable=True)[
        : max(1, top) if top is not None else None
    ]
    ranked = list(zip(ids[order].tolist(), logprobs[order].tolist(), strict=True))
    return Scored(ranked[0][0], ranked[0][1], ranked)


@dataclass(frozen=True)
class Echoed:
    """A prompt's own tokens scored: log p(token_t | tokens before t) for t >= 1, and the `top`
    most probable ids at each of those positions."""

    token_logprobs: list[float]
    top: list[list[tuple[int, float]]]


ECHO_CHUNK = 256  # positions turned into log-probabilities at once: [256, V] float32 at most


def echo_scores(logits: torch.Tensor, prompt: list[int], ranking: Ranking) -> Echoed:
    """Each prompt token's log-probability from the logits `[len - 1, V]` of the positions
    before it, and the ranking's `top` alternatives there (temperature as in `score`)."""
    targets = torch.tensor(prompt[1:], dtype=torch.long)
    top = ranking.top or 0
    picked: list[float] = []
    alternatives: list[list[tuple[int, float]]] = []
    for begin in range(0, logits.shape[0], ECHO_CHUNK):
        block = logits[begin : begin + ECHO_CHUNK].float()
        if ranking.temperature > 0:
            block = block / ranking.temperature
        if bool(torch.isnan(block).any()) or bool(torch.isposinf(block).any()):
            raise NonFiniteLogits("the model produced NaN or +inf logits over the prompt")
        logprobs = torch.log_softmax(block, dim=-1)
        picked += logprobs.gather(1, targets[begin : begin + ECHO_CHUNK, None])[:, 0].tolist()
        if top:
            values, ids = torch.topk(logprobs, min(top, logprobs.shape[1]), dim=-1)
            alternatives += [
                list(zip(row_ids, row_values, strict=True))
                for row_ids, row_values in zip(ids.tolist(), values.tolist(), strict=True)
            ]
        else:
            alternatives += [[] for _ in range(block.shape[0])]
    return Echoed(picked, alternatives)


def check_reported(scored: Scored, reported: int) -> None:
    """A reported token (the chosen one, or one of the first `reported` candidates) must have a
    finite log-probability."""
    for token_id, logprob in [(scored.chosen, scored.chosen_logprob), *scored.ranked[:reported]]:
        if logprob == float("-inf"):
            raise NonFiniteLogits(f"token {token_id} is reported but its logit is -inf")


# Prompts run together in one pass when they may start from the prefix cache: a scorer's chats
# each add a few dozen tokens to a shared few-shot start, and one row per pass would spend the
# pass on per-layer overhead and on a matmul too narrow for the CPU's fast kernels (DENSE_ROWS).
REUSE_ROWS = 8


def cached_last_logits(
    lm: LoadedModel, cache: PrefixCache, prompts: list[list[int]]
) -> torch.Tensor:
    """Unsteered prompts' next-token logits `[n, V]` from one pass, their first positions restored
    from the prefix cache where it holds them; their whole blocks are stored for the next
    prompts."""
    restored: list[KV | None] = []
    for prompt in prompts:
        chain = cache.lookup(prompt, UNSTEERED, len(prompt) - 1)
        restored.append(cache.restore(chain) if chain else None)
    prefill = begin_prefill(lm.runner, prompts, max(map(len, prompts)), restored)
    for reused in prefill.reused:
        cache.record(reused)
    logits = advance_prefill(lm.runner, prefill, None)
    assert logits is not None  # one pass covers every column
    for i, prompt in enumerate(prompts):
        cache.store(prompt, UNSTEERED, partial(lm.runner.row_kv, prefill.batch, i))  # type: ignore[attr-defined]  # a cache exists only beside a chunked runner
    return logits


def reuse_groups(count: int) -> list[range]:
    """Prompt indices in passes: the first alone, so the start it shares with the others is in the
    cache before they look; then REUSE_ROWS at a time."""
    if count == 0:
        return []
    return [range(0, 1)] + [
        range(start, min(start + REUSE_ROWS, count)) for start in range(1, count, REUSE_ROWS)
    ]


class ReadsTaken(Exception):
    """Raised in a reads-only pass once every read point has been passed: what the layers after
    them compute (the logits) was not asked for."""


def stopping(tapped: dict[int, Tap]) -> dict[int, Tap]:
    """The taps of one forward pass, the last of them to run raising ReadsTaken after it read."""
    left = set(tapped)

    def wrapped(point: int, inner: Tap) -> Tap:
        def tap(before: torch.Tensor, after: torch.Tensor) -> None:
            inner(before, after)
            left.discard(point)
            if not left:
                raise ReadsTaken

        return tap

    return {point: wrapped(point, inner) for point, inner in tapped.items()}


def run_scoring(lm: LoadedModel, job: ScoringJob, cache: PrefixCache | None = None) -> None:
    """One forward pass per prompt (steered only by the job's own edit, which scoring never sets; a
    job reusing the prefix cache: a few prompts a pass); emits the last-position logits of each (a
    reads-only job: its reads alone, each pass cut short after them)."""
    drained(scoring_steps(lm, job, cache))


@torch.inference_mode()
def scoring_steps(
    lm: LoadedModel,
    job: ScoringJob,
    cache: PrefixCache | None = None,
    chunk: Callable[[], int | None] | None = None,
) -> Steps[None]:
    """`run_scoring` as steps: each pass may pause (paused.py) between its blocks on the lean
    runner or, given `chunk`, between chunks of `chunk()` tokens on llama.cpp; a scheduler that
    pauses it must run it to its end or close it itself."""
    lm.residual.clear()
    reuse = (
        cache if job.reuse_prefix and not job.reads and job.edit is None and not job.echo else None
    )
    results: list[torch.Tensor] = []
    reads: list[ResidualsRead] = []
    echoed: list[Echoed] = []
    try:
        if reuse is not None:
            finished = reused_passes(lm, reuse, job, results)
        else:
            finished = yield from passes(lm, job, results, reads, echoed, chunk)
    finally:
        lm.residual.clear()
    if not finished:
        return
    scored = [rank(row, job.ranking) for row in results] if job.ranking is not None else []
    job.emit(ScoresReady(results, reads, scored, echoed))


PACK_ROWS = 16  # prompts one packed pass holds at most
PACK_TOKENS = 16_384  # and padded positions (rows x the longest prompt)


def packs(lengths: list[int]) -> list[list[int]]:
    """Prompt indices in packed passes, in order: as many as PACK_ROWS and PACK_TOKENS allow."""
    groups: list[list[int]] = []
    for index, length in enumerate(lengths):
        group = groups[-1] if groups else None
        if group is not None:
            wider = max(length, *(lengths[i] for i in group))
            if len(group) < PACK_ROWS and wider * (len(group) + 1) <= PACK_TOKENS:
                group.append(index)
                continue
        groups.append([index])
    return groups


@torch.inference_mode()
def run_packed(lm: LoadedModel, jobs: list[ScoringJob]) -> None:
    """Packable jobs' prompts in shared padded passes (unsteered, each prompt's logits at its own
    last token); each job that was not cancelled gets its ScoresReady."""
    prompts = [(job, prompt) for job in jobs for prompt in job.prompts]
    logits: list[torch.Tensor] = []
    lm.residual.clear()
    for group in packs([len(prompt) for _, prompt in prompts]):
        rows = [prompts[i][1] for i in group]
        _, out = lm.runner.prefill(rows, capacity=max(map(len, rows)))
        logits.extend(out.float().cpu())
    for job in jobs:
        mine, logits = logits[: len(job.prompts)], logits[len(job.prompts) :]
        if job.cancelled.is_set():
            continue
        scored = [rank(row, job.ranking) for row in mine] if job.ranking is not None else []
        job.emit(ScoresReady(mine, [], scored, []))


def reused_passes(
    lm: LoadedModel, cache: PrefixCache, job: ScoringJob, results: list[torch.Tensor]
) -> bool:
    """The job's last-position logits, a few prompts a pass from the prefix cache; False when
    it was cancelled."""
    for group in reuse_groups(len(job.prompts)):
        if job.cancelled.is_set():
            return False
        logits = cached_last_logits(lm, cache, [job.prompts[i] for i in group])
        results.extend(logits.float().cpu())
    return True


def passes(
    lm: LoadedModel,
    job: ScoringJob,
    results: list[torch.Tensor],
    reads: list[ResidualsRead],
    echoed: list[Echoed],
    chunk: Callable[[], int | None] | None = None,
) -> Steps[bool]:
    """One pass per prompt with the job's reads, edit and echo (each pass pausing as
    `scoring_steps` says); False when it was cancelled."""
    for index, prompt in enumerate(job.prompts):
        if job.cancelled.is_set():
            return False
        captures = [Capture(read, len(prompt)) for read in job.reads]
        stop = job.reads_only and bool(captures)
        install = lm.residual.clear
        if captures or job.edit is not None:  # read the residuals of this very pass
            tapped = taps([(captures, 0, len(prompt))])
            install = partial(
                lm.residual.install,
                lm.residual.stack([job.edit]) if job.edit is not None else None,
                stopping(tapped) if stop else tapped,
            )
        install()
        # Taps count positions from the pass's first column, so a pass that reads is not cut
        # into chunks (pausing between blocks keeps its columns whole).
        prompt_pass = partial(
            prefill_steps, lm.runner, [prompt], len(prompt), None if captures else chunk
        )
        before: torch.Tensor | None = None  # the logits predicting prompt[1:], with echo
        if stop:
            with suppress(ReadsTaken):
                yield from resumed(prompt_pass(), install)
            reads.extend(capture.result(index, prompt) for capture in captures)
            continue
        if job.echo and not captures and len(prompt) < lm.context_length:
            # One pass over prompt + a placeholder: the last row predicts the next token.
            every = yield from resumed(prompt_logits_steps(lm.runner, [*prompt, 0], 1), install)
            last, before = every[-1], every[:-1]
        else:
            _, logits = yield from resumed(prompt_pass(), install)
            last = logits[0]
            if job.echo and len(prompt) > 1:  # reads, or no room for a placeholder: two passes
                before = yield from resumed(prompt_logits_steps(lm.runner, prompt, 1), install)
        results.append(last.float().cpu())
        if job.echo:
            ranking = job.ranking or Ranking(None, 0.0)
            echoed.append(
                echo_scores(before.cpu(), prompt, ranking) if before is not None else Echoed([], [])
            )
        reads.extend(capture.result(index, prompt) for capture in captures)
    return True


def rank(logits: torch.Tensor, ranking: Ranking) -> Scored:
    """`score` with a job's ranking."""
    return score(logits, ranking.allowed, ranking.temperature, ranking.top)
