"""The evaluation job: every setting answers every instruction, the answers are rated and
measured, and the result is stored (the points so far when the job is cancelled).

Per setting: one engine job generates the answers (rows batched, greedy, steered by the
setting's plan or prompted by its system message); the judge rates each answer three times
(concept, instruction, fluency: scales.py); one unsteered pass scores each answer after its bare
instruction, whose mean negative log-likelihood per token gives its perplexity. An answer's
aggregate is the harmonic mean of its three ratings (AxBench); a point's figures are the means
over its answers; a candidate's best point is its highest mean harmonic mean (the first, on a
tie). The unsteered answers are the baseline every candidate is read against.

Every forward pass runs on the scheduler thread through kernel/runtime/blocking.py, under a lease
per call, and the job yields the scheduler to serving between its passes (MILLM_JOB_SHARE).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

from millm.engine.jobs import RowSpec
from millm.engine.prompts import chat_prompt_ids
from millm.engine.sampling import SamplingParams
from millm.kernel.runtime.blocking import generate_blocking, likelihoods_blocking
from millm.kernel.runtime.jobs import JobCancelled, JobHandle
from millm.lab.evaluations.judges import Judge
from millm.lab.evaluations.parts import EvaluationParts
from millm.lab.evaluations.protocol import (
    CandidateResult,
    EvaluationRequest,
    EvaluationResult,
    Point,
    Ranked,
    Sample,
)
from millm.lab.evaluations.scales import PROMPTS, Answer, harmonic_mean
from millm.lab.evaluations.sweep import UNSTEERED, Sweep, SweepPoint

PREFIX = "eval_"
MAX_ANSWERS = 600  # settings x instructions: each answer costs a generation and four passes
DEFAULT_INSTRUCTIONS = (
    "Tell me about your day.",
    "Give me three tips for staying focused while working.",
    "Describe your favourite meal.",
    "What should I pack for a weekend trip?",
    "Explain how a bicycle works.",
    "Write a short note thanking a friend for their help.",
)


@dataclass(frozen=True)
class PreparedEvaluation:
    """What the job needs, checked before it starts."""

    id: str
    body: EvaluationRequest
    model: str
    tokenizer: Any
    instructions: tuple[str, ...]
    sweeps: tuple[Sweep, ...]
    judge: Judge


def prompt_of(tokenizer, instruction: str, system: str | None) -> list[int]:
    """An instruction as a chat prompt, after the system message when there is one."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    return chat_prompt_ids(tokenizer, [*messages, {"role": "user", "content": instruction}])


def run_evaluation(
    state: EvaluationParts, prep: PreparedEvaluation, book, handle: JobHandle
) -> EvaluationResult:
    """Measure the baseline and every setting, then store the result (partial when cancelled)."""
    baseline: Point | None = None
    results = [CandidateResult(label=s.label, kind=s.kind, points=[]) for s in prep.sweeps]
    try:
        baseline = measure(state, prep, UNSTEERED, handle, None)
        handle.advance()
        for sweep, result in zip(prep.sweeps, results, strict=True):
            for setting in sweep.settings:
                result.points.append(measure(state, prep, setting, handle, baseline.perplexity))
                handle.advance()
    except JobCancelled:
        book.save(assemble(prep, baseline, results, handle.id, complete=False))
        raise
    finished = assemble(prep, baseline, results, handle.id, complete=True)
    book.save(finished)
    return finished


def measure(
    state: EvaluationParts,
    prep: PreparedEvaluation,
    setting: SweepPoint,
    handle: JobHandle,
    reference: float | None,
) -> Point:
    """One setting's answers, measured and rated; `reference` is the unsteered answers' mean
    perplexity (None while measuring them: their own)."""
    tokenizer = prep.tokenizer
    bare = [prompt_of(tokenizer, text, None) for text in prep.instructions]
    prompts = (
        bare
        if setting.system is None
        else [prompt_of(tokenizer, text, setting.system) for text in prep.instructions]
    )
    rows = [
        RowSpec(
            prompt_ids=tuple(ids),
            sampling=SamplingParams(temperature=0.0),
            max_tokens=prep.body.max_tokens,
            edit=setting.edit,
            watches=setting.watches,
        )
        for ids in prompts
    ]
    started = time.monotonic()
    texts = [
        g.text
        for g in generate_blocking(state.switch, prep.model, rows, cancel=handle.cancel_event)
    ]
    handle.check()
    tokens = [list(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
    scored = likelihoods_blocking(
        state.switch,
        prep.model,
        [ids + answer for ids, answer in zip(bare, tokens, strict=True)],
        [len(ids) for ids in bare],
        cancel=handle.cancel_event,
    )
    handle.check()
    assert scored is not None
    answers = [
        Answer(instruction, text, answer, perplexity(logprobs))
        for instruction, text, answer, logprobs in zip(
            prep.instructions, texts, tokens, scored, strict=True
        )
    ]
    if reference is None:
        reference = mean_perplexity(answers)
    ratings = prep.judge.rate(prep.body.concept, answers, reference, handle.cancel_event)
    handle.check()
    handle.pace(time.monotonic() - started)
    samples = [
        Sample(
            instruction=index,
            text=answer.text,
            concept=round(concept, 4),
            instruction_score=round(instruction, 4),
            fluency=round(fluency, 4),
            harmonic_mean=round(harmonic_mean([concept, instruction, fluency]), 4),
            perplexity=answer.perplexity,
        )
        for index, (answer, (concept, instruction, fluency)) in enumerate(
            zip(answers, ratings, strict=True)
        )
    ]
    return point(setting.strength, samples)


def mean_perplexity(answers: list[Answer]) -> float | None:
    """The mean perplexity of the answers that have one."""
    values = [a.perplexity for a in answers if a.perplexity is not None]
    return statistics.fmean(values) if values else None


def perplexity(logprobs: list[float]) -> float | None:
    """exp of the mean negative log-likelihood per token; None for an empty answer."""
    if not logprobs:
        return None
    return round(math.exp(-statistics.fmean(logprobs)), 4)


def point(strength: float | None, samples: list[Sample]) -> Point:
    """The means over a setting's answers."""

    def mean(values) -> float:
        return round(statistics.fmean(values), 4)

    perplexities = [s.perplexity for s in samples if s.perplexity is not None]
    return Point(
        strength=strength,
        concept=mean(s.concept for s in samples),
        instruction_score=mean(s.instruction_score for s in samples),
        fluency=mean(s.fluency for s in samples),
        harmonic_mean=mean(s.harmonic_mean for s in samples),
        perplexity=round(statistics.fmean(perplexities), 4) if perplexities else None,
        samples=samples,
    )


def assemble(
    prep: PreparedEvaluation,
    baseline: Point | None,
    results: list[CandidateResult],
    job_id: str,
    complete: bool,
) -> EvaluationResult:
    """The stored document: each candidate's best point, and the ranking of those (the baseline
    among them)."""
    for result in results:
        result.best = max(result.points, key=lambda p: p.harmonic_mean, default=None)
    lines = [("unsteered", "unsteered", baseline)] if baseline is not None else []
    lines += [(r.label, r.kind, r.best) for r in results if r.best is not None]
    ranking = [
        Ranked(
            label=label,
            kind=kind,
            strength=p.strength,
            harmonic_mean=p.harmonic_mean,
            concept=p.concept,
            instruction_score=p.instruction_score,
            fluency=p.fluency,
        )
        for label, kind, p in lines
        if p is not None
    ]
    ranking.sort(key=lambda r: -r.harmonic_mean)  # stable: the baseline first on a tie
    return EvaluationResult(
        id=prep.id,
        name=prep.body.name,
        concept=prep.body.concept,
        model=prep.model,
        created_at=time.time(),
        job_id=job_id,
        complete=complete,
        judge=prep.judge.describe(),
        rating_prompts=dict(PROMPTS),
        instructions=list(prep.instructions),
        max_tokens=prep.body.max_tokens,
        baseline=baseline,
        candidates=results,
        ranking=ranking,
    )
