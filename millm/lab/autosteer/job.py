"""AutoSteer: from a plain-language goal to a ranked list of steering settings, as a job.

1. Candidates: features whose labels match the goal (the label search), and, when the caller
   gives example texts, the features that best separate them from neutral texts (contrast).
2. A sweep: each candidate at a few strengths (by default fractions of the residual norm at
   the SAE's layer, divided by the feature's decoder norm, so the sweep means the same on any
   SAE), answering a few probe prompts greedily.
3. Judging, by the server's own unsteered model: concept = P(yes) that the answer matches the goal
   (lab/discovery/judge.py, through the scoring path, never steered); affinity = how much likelier
   the answer is when the model is told the goal in a system message than when told something
   neutral (per token); fluency = the answer's mean log-probability per token after the bare prompt.
4. Ranking: fluent settings (fluency at most `fluency_tolerance` below the unsteered answers')
   first, by the chosen signal (`rank_by`: the judge, or the affinity); `best` is the first
   fluent one that beats the unsteered answers on it. It can be saved as a profile.

Every forward pass runs on the scheduler thread through kernel/runtime/blocking.py; the job's thread
only tokenises, orders and waits, and yields the scheduler to serving between its passes.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from millm.engine.jobs import ResidualRead, RowSpec
from millm.engine.prompts import completion_prompt_ids
from millm.engine.residual import ResidualEdit
from millm.engine.sampling import SamplingParams
from millm.errors import InvalidRequest
from millm.interp.intensity import clamp_strength
from millm.kernel.runtime.blocking import generate_blocking, likelihoods_blocking, passes_blocking
from millm.kernel.runtime.jobs import JobHandle
from millm.lab.autosteer.inputs import (
    CONTROL_SYSTEM,
    GOAL_SYSTEM,
    NEUTRAL_TEXTS,
    SKIPPED_POSITIONS,
    PreparedAutoSteer,
    search_words,
)
from millm.lab.autosteer.parts import AutoSteerParts
from millm.lab.autosteer.protocol import (
    DEFAULT_FRACTIONS,
    AutoSteerResult,
    Baseline,
    Candidate,
    Setting,
)
from millm.lab.autosteer.ranking import Judged, judged_setting, lift, rank_settings
from millm.lab.discovery.contrast import contrast_prompts_blocking


# the job ------------------------------------------------------------------------------------------
def run_autosteer(
    state: AutoSteerParts, prep: PreparedAutoSteer, handle: JobHandle
) -> AutoSteerResult:
    """The whole loop: candidates, sweep, judge, rank, save."""
    body = prep.body
    candidates = find_candidates(state, prep, handle)
    if not candidates:
        raise InvalidRequest(
            "no candidate features: no feature label matches the goal's words"
            + ("" if body.examples else "; give examples to contrast with neutral text"),
            param="goal",
        )
    residual_norm, vectors, norms = measure(state, prep, [c[0] for c in candidates], handle)
    labels = state.saes.labels(prep.attached.info.id)
    chosen = [
        Candidate(
            index=i,
            label=label_of(labels, i),
            source=source,
            evidence=round(evidence, 4) if math.isfinite(evidence) else None,
            decoder_norm=round(norms[i], 4),
        )
        for i, source, evidence in candidates
    ]
    handle.set_total(sum(len(vectors[c.index]) for c in chosen))
    baseline_texts = generate(state, prep, [None] * len(prep.probes), handle)
    judged = judge_texts(state, prep, baseline_texts, handle)
    baseline = Baseline(
        concept=round(judged.concept, 4),
        affinity=round(judged.affinity or 0.0, 4),
        fluency=round(judged.fluency or 0.0, 4),
        samples=baseline_texts,
    )
    settings = []
    for candidate in chosen:
        for strength, vector in vectors[candidate.index]:
            edit = ResidualEdit(((prep.attached.point, vector),))
            texts = generate(state, prep, [edit] * len(prep.probes), handle)
            settings.append(
                judged_setting(
                    candidate,
                    strength,
                    texts,
                    judge_texts(state, prep, texts, handle),
                    baseline,
                    body,
                )
            )
            handle.advance()
    ranked = rank_settings(settings, body.rank_by)
    best = next((s for s in ranked if s.fluent and lift(s, body.rank_by) > 0), None)
    result = AutoSteerResult(
        goal=body.goal,
        sae_id=prep.attached.info.id,
        layer=prep.attached.layer,
        residual_norm=round(residual_norm, 3),
        judge_prompt=prep.judge.shown_prompt(prep.tokenizer),
        goal_system=GOAL_SYSTEM.format(goal=body.goal),
        control_system=CONTROL_SYSTEM,
        rank_by=body.rank_by,
        probe_prompts=list(prep.probes),
        candidates=chosen,
        baseline=baseline,
        settings=ranked,
        best=best,
    )
    if body.save_as is not None:
        if best is None:
            result.note = (
                "no fluent setting beat the unsteered answers, so no profile "
                f"{body.save_as!r} was saved"
            )
        else:
            result.saved_profile = save_profile(state, prep, best)
    return result


def label_of(labels: dict[int, dict], index: int) -> str | None:
    """A feature's label, if it has one."""
    entry = labels.get(index)
    return entry.get("label") if entry else None


def find_candidates(
    state: AutoSteerParts, prep: PreparedAutoSteer, handle: JobHandle
) -> list[tuple[int, str, float]]:
    """(index, source, evidence) of the features to try: label matches, and contrast winners when
    examples were given, taken in turn, without repeats, up to `candidates`; then those the caller
    included that were not found (evidence: none)."""
    body = prep.body
    sae_id = prep.attached.info.id
    from_labels = [
        (hit.index, "labels", hit.score or 0.0)
        for hit in state.labels.search(sae_id, search_words(body.goal), body.candidates)
    ]
    from_contrast: list[tuple[int, str, float]] = []
    if body.examples:
        from_contrast = contrast_candidates(state, prep, handle)
    chosen: list[tuple[int, str, float]] = []
    seen: set[int] = set()
    for pair in _alternate(from_contrast, from_labels):
        if pair[0] not in seen:
            seen.add(pair[0])
            chosen.append(pair)
        if len(chosen) == body.candidates:
            break
    chosen += [(index, "given", math.nan) for index in body.include or () if index not in seen]
    return chosen


def _alternate(first: list, second: list) -> list:
    """first[0], second[0], first[1], second[1], ... then the rest of the longer one."""
    out = []
    for i in range(max(len(first), len(second))):
        out += first[i : i + 1] + second[i : i + 1]
    return out


def contrast_candidates(
    state: AutoSteerParts, prep: PreparedAutoSteer, handle: JobHandle
) -> list[tuple[int, str, float]]:
    """The features that most separate the examples from the neutral texts (unsteered), by effect
    size."""
    tokenizer = prep.tokenizer
    examples = [completion_prompt_ids(tokenizer, text) for text in prep.body.examples or ()]
    neutral = [
        completion_prompt_ids(tokenizer, text) for text in prep.body.neutral or NEUTRAL_TEXTS
    ]
    started = time.monotonic()
    # Mean over positions: a concept feature fires in every example, at peaks that vary from text to
    # text, and Cohen's d on the max then ranks it low (the pirate feature on the demo SAE: 11th by
    # max, 2nd by mean).
    found = contrast_prompts_blocking(
        state,
        prep.model,
        prep.attached,
        examples,
        neutral,
        aggregate="mean",
        top_k=prep.body.candidates,
        cancel=handle.cancel_event,
    )
    handle.pace(time.monotonic() - started)
    # An infinite effect (both sets constant and different) is the strongest evidence there is.
    return [
        (f.index, "contrast", f.effect_size if f.effect_size is not None else math.inf)
        for f in found.favouring_a
        if f.difference > 0
    ]


def measure(
    state: AutoSteerParts, prep: PreparedAutoSteer, indices: list[int], handle: JobHandle
) -> tuple[float, dict[int, list[tuple[float, torch.Tensor]]], dict[int, float]]:
    """The median residual norm at the SAE's point over the probe prompts (unsteered; measured on
    the scheduler thread), each candidate's decoder norm, and each candidate's sweep as
    (strength, strength * W_dec[i]).

    The decoder-row arithmetic here runs on the job's thread: each operation touches one row
    (d_in values, far below torch's parallel grain of 32,768 elements), so it never starts an
    OpenMP pool on this thread, which is what slows the scheduler's decoding (threads.py)."""
    body, sae = prep.body, prep.attached.sae

    def summarise(residuals: torch.Tensor):
        return residuals[SKIPPED_POSITIONS:].norm(dim=-1)

    read = ResidualRead(prep.attached.point, False, "prompt", "autosteer", encode=summarise)
    started = time.monotonic()
    answer = passes_blocking(
        state.switch,
        prep.model,
        [list(ids) for ids in prep.probe_ids],
        (read,),
        cancel=handle.cancel_event,
    )
    handle.check()
    handle.pace(time.monotonic() - started)
    assert answer is not None
    norms_seen = [float(x) for captured in answer.reads for x in captured.encoded.tolist()]
    residual_norm = statistics.median(norms_seen) if norms_seen else 1.0
    decoder_norms = {i: float(sae.W_dec[i].norm()) for i in indices}
    sweeps: dict[int, list[tuple[float, torch.Tensor]]] = {}
    for i in indices:
        if body.strengths is not None:
            strengths = [clamp_strength(s) for s in body.strengths]
        else:
            fractions = body.strength_fractions or DEFAULT_FRACTIONS
            strengths = [
                round(clamp_strength(f * residual_norm / max(decoder_norms[i], 1e-6)), 2)
                for f in fractions
            ]
        sweeps[i] = [(s, (s * sae.W_dec[i].float()).cpu()) for s in strengths]
    return residual_norm, sweeps, decoder_norms


def generate(
    state: AutoSteerParts,
    prep: PreparedAutoSteer,
    edits: list[ResidualEdit | None],
    handle: JobHandle,
) -> list[str]:
    """Each probe prompt answered greedily with its edit (one engine job, rows batched together)."""
    rows = [
        RowSpec(
            prompt_ids=ids,
            sampling=SamplingParams(temperature=0.0),
            max_tokens=prep.body.max_tokens,
            edit=edit,
        )
        for ids, edit in zip(prep.probe_ids, edits, strict=True)
    ]
    started = time.monotonic()
    generated = generate_blocking(state.switch, prep.model, rows, cancel=handle.cancel_event)
    handle.check()
    handle.pace(time.monotonic() - started)
    return [g.text for g in generated]


def judge_texts(
    state: AutoSteerParts, prep: PreparedAutoSteer, texts: list[str], handle: JobHandle
) -> Judged:
    """Over `texts` (one answer per probe): the judge's mean P(yes); the affinity (mean per-token
    log-probability gain of the answers after the goal's system message over the neutral one);
    the fluency (mean log-probability per token after the bare probe prompts)."""
    tokenizer = prep.tokenizer
    questions = [prep.judge.prompt_ids(tokenizer, text) for text in texts]
    started = time.monotonic()
    scores = passes_blocking(
        state.switch, prep.model, questions, ranking=prep.judge.ranking, cancel=handle.cancel_event
    )
    handle.check()
    assert scores is not None
    concept = statistics.fmean(prep.judge.p_yes(scored) for scored in scores.scored)
    answers = [list(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]  # type: ignore[operator]
    prompts = [*prep.probe_ids, *prep.goal_ids, *prep.control_ids]
    sequences = [list(ids) + answer for ids, answer in zip(prompts, answers * 3, strict=True)]
    logprobs = likelihoods_blocking(
        state.switch,
        prep.model,
        sequences,
        [len(ids) for ids in prompts],
        cancel=handle.cancel_event,
    )
    handle.check()
    handle.pace(time.monotonic() - started)
    assert logprobs is not None
    n = len(texts)
    bare, primed, control = logprobs[:n], logprobs[n : 2 * n], logprobs[2 * n :]
    tokens = [lp for row in bare for lp in row]
    gains = [
        g - c
        for grow, crow in zip(primed, control, strict=True)
        for g, c in zip(grow, crow, strict=True)
    ]
    return Judged(
        concept,
        statistics.fmean(gains) if gains else None,
        statistics.fmean(tokens) if tokens else None,
    )


def save_profile(state: AutoSteerParts, prep: PreparedAutoSteer, best: Setting) -> dict:
    """Store the best setting as a profile; returns {id, name}."""
    document = {
        "kind": "millm.profile",
        "version": 1,
        "name": prep.body.save_as,
        "description": f"AutoSteer for {prep.body.goal!r}: feature {best.index} "
        f"({best.label or 'unlabelled'}) at {best.strength}, judge P(yes) {best.concept} vs "
        f"{best.concept - best.lift:.4f} unsteered, affinity {best.affinity} vs "
        f"{best.affinity - best.affinity_lift:.4f}",
        "steering": [
            {
                "sae_id": prep.attached.info.id,
                "layer": prep.attached.layer,
                "features": [{"index": best.index, "strength": best.strength}],
            }
        ],
    }
    row = state.profiles.create(document)
    return {"id": row["id"], "name": row["name"]}
