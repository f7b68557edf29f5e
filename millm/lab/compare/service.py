"""POST /api/compare: one conversation generated under several steering variants, as the rows of one
engine job, answered whole or as a stream of events tagged with the variant's index.

The conversation is rendered and tokenised once; every variant is a row with that prompt, the
same sampling fields and the same seed (drawn once when the request sends none), so the
variants differ by their steering alone. The rows are prefilled together in one batched forward
pass, rows with the same steering (unsteered and an empty live state, say) sharing one prefill
row. The KV cache itself cannot be shared between variants with different steering: steering
adds its delta at every position, the prompt's included, so a steered variant's prompt residuals
(and keys and values past the steered layer) are not the unsteered ones.

A comparison is a research read of the model, not served traffic: monitoring does not record it.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import replace

from anyio import to_thread

from millm.engine.jobs import JobFailed, RowFinished, RowSpec, TextDelta
from millm.engine.loader import LoadedModel
from millm.errors import MillmError
from millm.kernel.steering.plan import Plan
from millm.lab.compare.parts import CompareParts
from millm.lab.compare.protocol import (
    CompareDelta,
    CompareFinish,
    CompareRequest,
    CompareStart,
    CompareUsage,
    Comparison,
    VariantAnswer,
    VariantInfo,
)
from millm.lab.compare.variants import Resolved, find_bases, resolve_variants
from millm.v1.objects import Usage, WireModel
from millm.v1.policy.field_policy import (
    TEMPLATE_KEYS,
    handle_unused,
    unused_locations,
    unused_on_model,
)
from millm.v1.serving.answers import Meta
from millm.v1.serving.generation import (
    SEED_SPACE,
    Collected,
    GenerationOptions,
    JobStream,
    RowFill,
    build_rows,
    collect,
)
from millm.v1.serving.prechecks import check_rows
from millm.v1.serving.prompts import conversation_ids
from millm.v1.serving.replies import Reply, Report
from millm.v1.serving.serving import generation_options

# The seed's promise: the same body and seed give the same texts, rows batched as they were.
SEED_SCOPE = "batch-shape"


def variant_rows(
    lm: LoadedModel,
    prompt: list[int],
    options: GenerationOptions,
    plans: list[Plan],
    default_max_tokens: int,
) -> list[RowSpec]:
    """One row per plan, in order: the same prompt, sampling and seed (choice 0's), each steered
    by its plan."""
    one = replace(options, n=1)
    return [
        build_rows(
            lm,
            [prompt],
            one,
            default_max_tokens,
            "messages",
            RowFill(plan.edit, watches=plan.watches),
        )[0]
        for plan in plans
    ]


def variant_info(index: int, variant: Resolved) -> VariantInfo:
    """A variant's position, label and steering."""
    return VariantInfo(index=index, label=variant.label, steering=variant.steering)


def comparison(
    meta: Meta, seed: int, prompt_tokens: int, resolved: list[Resolved], result: Collected
) -> Comparison:
    """The whole answer: each variant's text and usage (its prompt counted), and totals (the prompt
    counted once, and as cached as the variant that reused the most of it)."""
    variants = [
        VariantAnswer(
            index=i,
            label=variant.label,
            steering=variant.steering,
            text=result.texts[i],
            finish_reason=result.finish_reasons[i],
            usage=Usage.of(prompt_tokens, result.row_tokens[i], result.row_cached[i]),
        )
        for i, variant in enumerate(resolved)
    ]
    return Comparison(
        id=meta.id,
        created=meta.created,
        model=meta.model,
        seed=seed,
        variants=variants,
        usage=Usage.of(prompt_tokens, result.completion_tokens, max(result.row_cached, default=0)),
    )


async def compare_events(
    stream: JobStream, meta: Meta, seed: int, prompt_tokens: int, resolved: list[Resolved]
) -> AsyncIterator[WireModel | MillmError]:
    """The stream: what each variant is, text deltas tagged with the variant, a finish event per
    variant with its usage, the totals; or the error that ended it. Closing it cancels the job."""
    completion_tokens = cached = 0
    try:
        infos = [variant_info(i, variant) for i, variant in enumerate(resolved)]
        yield CompareStart(
            id=meta.id, created=meta.created, model=meta.model, seed=seed, variants=infos
        )
        async for event in stream.events():
            if isinstance(event, TextDelta):
                yield CompareDelta(variant=event.row, delta=event.text)
            elif isinstance(event, RowFinished):
                completion_tokens += event.completion_tokens
                cached = max(cached, event.cached_tokens)
                yield CompareFinish(
                    variant=event.row,
                    finish_reason=event.finish_reason,
                    usage=Usage.of(prompt_tokens, event.completion_tokens, event.cached_tokens),
                )
            elif isinstance(event, JobFailed):
                yield event.error
                return
        yield CompareUsage(usage=Usage.of(prompt_tokens, completion_tokens, cached))
    finally:
        stream.cancel()


class Comparer:
    """The compare route's one way in."""

    def __init__(self, state: CompareParts):
        self.state = state

    async def compare(self, body: CompareRequest, strict: bool) -> Reply:
        """Generate the conversation under every variant together; the whole answer or its
        events."""
        check_rows(body, self.state.settings.max_rows_per_request)
        # as if the template read every optional message key: what is left is unused on any model
        if strict:
            handle_unused(unused_locations(body, reads=set(TEMPLATE_KEYS)), True)
        books = {
            "profile": self.state.profiles,
            "cluster": self.state.clusters,
            "circuit": self.state.circuits,
        }
        await to_thread.run_sync(find_bases, books, body.variants)
        lm = await self.state.switch.acquire(body.model or self.state.switch.expected_name)
        ignored = unused_on_model(strict, body, False, lm)
        prompt = await to_thread.run_sync(conversation_ids, lm, body.messages)
        resolved = await to_thread.run_sync(resolve_variants, self.state.planner, body.variants)
        seed = body.seed if body.seed is not None else secrets.randbelow(SEED_SPACE)
        options = replace(generation_options(body), seed=seed)
        rows = variant_rows(
            lm,
            prompt,
            options,
            [variant.plan for variant in resolved],
            self.state.settings.default_max_tokens,
        )
        stream = JobStream(rows)
        self.state.switch.submit(stream.job)
        meta = Meta.new("cmp", lm.name, lm.system_fingerprint)
        report = Report(
            ignored, Plan(None, "compare", (("variants", len(resolved)),)), seed, SEED_SCOPE
        )
        if body.stream:
            return Reply(report, chunks=compare_events(stream, meta, seed, len(prompt), resolved))
        result = await collect(stream, len(rows))
        return Reply(report, body=comparison(meta, seed, len(prompt), resolved, result))
