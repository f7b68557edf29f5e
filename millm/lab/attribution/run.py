"""POST /api/attribution: a graph computed in steps on the scheduler thread, then checked.

The request's checks come first (inputs.py); then each step of the tracer (interp/attribution/
graph.py) is one engine call, so serving goes on between a graph's backward passes; then the top
features are ablated on the served model (interp/attribution/verify.py) and the answer is said with
token strings and labels (answer.py). Unsteered unless `steering` asks, in inspect's vocabulary. A
client that leaves cancels the work; the pass it held is let go on the scheduler thread.

A model served on llama.cpp keeps its weights to itself, and a graph differentiates them: the
graph is traced (and checked) on a transformers copy of the same file, loaded beside the served
model for the request and freed after it (kernel/model/beside.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from anyio import to_thread

from millm.engine.families import supported
from millm.engine.jobs import CallDone, CallJob
from millm.engine.loader import LoadedModel
from millm.errors import InvalidRequest, ModelNotLoaded
from millm.interp.attribution.graph import Budget, Graph, Target, Tracer
from millm.interp.attribution.replacement import ReplacementModel, Source, plain_source
from millm.interp.attribution.verify import AblationCheck, served_logits, verify
from millm.kernel.books.transcoders import TranscoderBook
from millm.kernel.model.loading import Planned
from millm.kernel.runtime.jobs import JobHandle
from millm.lab.attribution.answer import graph_answer
from millm.lab.attribution.inputs import budget_of, feature_sources, target_of
from millm.lab.attribution.parts import AttributionParts
from millm.lab.attribution.protocol import AttributionGraph, AttributionRequest
from millm.lab.discovery.inputs import (
    ReadSteering,
    check_steering_request,
    model_to_read,
    resolve_steering,
)
from millm.lab.discovery.inspection import inspect_prompt
from millm.v1.serving.generation import answered


async def on_engine(submit: Callable[[CallJob], None], call) -> Any:
    """Run `call(lm)` on a scheduler's thread as one engine job (`submit`: the served model's
    scheduler, or the copy's); returns what it returns."""
    done = await answered(submit, CallDone, lambda emit: CallJob(call=call, emit=emit))
    return done.value


def begin(lm: LoadedModel, prepared: PreparedGraph) -> Tracer:
    """The first step: the model's top token when no target was asked, the replacement pass and
    the target's row."""
    prompt, edit, target = prepared.prompt, prepared.steered.edit, prepared.target
    if target is None:
        target = Target((int(served_logits(lm, prompt, edit).argmax()),), (1.0,))
    model = ReplacementModel(lm.runner.layout)  # type: ignore[attr-defined]  # the lean runner's, checked before
    plain = [plain_source(source, model.dtype) for source in prepared.sources]
    steps = prepared.body.integrated_gradients
    tracer = Tracer(model, prompt, plain, target, prepared.budget, edit, steps)
    tracer.start()
    return tracer


def checked(
    lm: LoadedModel, graph: Graph, count: int, steered: ReadSteering
) -> AblationCheck | None:
    """The last step: ablate the `count` most influential expanded features on the served model."""
    if count == 0 or not graph.features:
        return None
    influence = graph.pruned.influence[: len(graph.features)]
    top = [int(i) for i in influence.argsort(descending=True)[:count] if influence[i] > 0]
    return verify(lm, graph, top, steered.edit)


@dataclass(frozen=True)
class PreparedGraph:
    """A request that passed every check: what its graph is traced from."""

    body: AttributionRequest
    model: str
    prompt: list[int]
    sources: list[Source]
    target: Target | None
    budget: Budget
    steered: ReadSteering
    copy: Planned | None  # a transformers copy to trace on, when the model is served on llama.cpp


async def prepare(
    state: AttributionParts, body: AttributionRequest, sets: TranscoderBook
) -> PreparedGraph:
    """Every check a graph request can fail (a 400 naming the field), before any pass."""
    await to_thread.run_sync(check_steering_request, state, body.steering)
    lm = await state.switch.acquire(model_to_read(state, body.model))
    if not supported(lm.config):
        raise InvalidRequest(
            f"attribution runs on the lean runner's families; {lm.name} ({lm.config.model_type}) "
            "runs on transformers' own forward",
            param="model",
        )
    prompt = await to_thread.run_sync(inspect_prompt, lm, body, state.settings.discovery_max_tokens)
    sources = feature_sources(state, body, lm, sets)
    target = await to_thread.run_sync(target_of, lm, body.target)
    budget = budget_of(body, lm, sources, len(prompt))
    steered = await to_thread.run_sync(resolve_steering, state, body.steering, None)
    copy = None
    if not lm.differentiable:
        copy = await to_thread.run_sync(state.switch.beside.plan_copy, lm)
    return PreparedGraph(body, lm.name, prompt, sources, target, budget, steered, copy)


async def trace(
    state: AttributionParts, prepared: PreparedGraph, job: JobHandle | None = None
) -> AttributionGraph:
    """The prepared graph traced, pruned and checked; as a `job`, each batch of features
    expanded is progress, and the job's share of the scheduler is kept between steps."""
    body, steered = prepared.body, prepared.steered
    served = state.switch.lm
    if job is not None and (served is None or served.name != prepared.model):
        # A job never loads a model (acquire would, replacing the one everyone is using).
        raise ModelNotLoaded(
            f"model {prepared.model!r} is no longer loaded (it was unloaded or replaced before "
            "the job ran)"
        )
    lm = await state.switch.acquire(prepared.model)
    started = time.monotonic()
    if prepared.copy is None:
        graph, verification = await traced(state.switch.submit, prepared, job)
    else:
        held = state.switch.beside.loaded(prepared.copy)
        copy = await to_thread.run_sync(held.__enter__)
        try:
            graph, verification = await traced(copy.submit, prepared, job)
        finally:
            await to_thread.run_sync(held.__exit__, None, None, None)
    seconds = time.monotonic() - started
    return await to_thread.run_sync(
        graph_answer,
        state,
        lm,
        graph,
        verification,
        body,
        steered,
        f"graph-{uuid.uuid4().hex[:12]}",
        seconds,
    )


async def traced(
    submit: Callable[[CallJob], None], prepared: PreparedGraph, job: JobHandle | None
) -> tuple[Graph, AblationCheck | None]:
    """The graph traced a step per engine job on `submit`'s scheduler, then checked there."""
    body, steered = prepared.body, prepared.steered
    tracer: Tracer | None = None
    try:
        tracer = await on_engine(submit, lambda lm: begin(lm, prepared))
        while True:
            step = time.monotonic()
            expanded = await on_engine(submit, lambda lm: tracer.expand())
            if not expanded:
                break
            if job is not None:
                job.advance(expanded)
                await job.pace_on_loop(time.monotonic() - step)
        graph: Graph = await on_engine(submit, lambda lm: tracer.finish())
        tracer = None
    finally:
        if tracer is not None:  # cancelled or failed mid-way: free the pass where torch runs
            submit(CallJob(call=tracer.drop, emit=lambda event: None))
    verification = await on_engine(submit, lambda lm: checked(lm, graph, body.verify, steered))
    return graph, verification


async def attribute(
    state: AttributionParts, body: AttributionRequest, sets: TranscoderBook
) -> AttributionGraph:
    """The graph of the prompt's target, pruned and checked."""
    return await trace(state, await prepare(state, body, sets))
