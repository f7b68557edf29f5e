"""Serving /v1/chat/completions and /v1/completions: a validated body becomes prompts, a steering
plan and engine rows (or a scoring job); the engine's events become typed bodies.

One method per route, each returning a Reply: the body (or its chunks) and a Report of how the
request was served, which the API turns into the X-miLLM-* headers. The order of the checks is
the order a client would fix them: request-only refusals before the model is acquired (and
possibly loaded), then what depends on the model, then admission.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from anyio import to_thread
from pydantic import BaseModel

from millm.engine.loader import LoadedModel
from millm.engine.prompts import has_chat_template
from millm.engine.sampling import SamplingParams
from millm.errors import InvalidRequest
from millm.kernel.monitoring.requests import Origin
from millm.kernel.probes.watches import NO_PROBES, Asked, ProbeSet, watch_request
from millm.kernel.steering.plan import NO_STEERING, Plan
from millm.kernel.variants.naming import Named
from millm.v1.policy.field_policy import (
    AS_SENT,
    SentAs,
    handle_unused,
    template_kwargs_unused,
    template_reads,
    unused_locations,
)
from millm.v1.policy.response_format import refused_under_batching
from millm.v1.serving.activations import ActivationRead, ReadRequest, plan_read
from millm.v1.serving.answers import (
    ChatShape,
    CompletionShape,
    Meta,
    Shape,
    chunks,
)
from millm.v1.serving.answers_read import validate_output
from millm.v1.serving.embeddings import embed
from millm.v1.serving.generation import (
    GenerationOptions,
    JobStream,
    RowFill,
    build_rows,
    collect,
    completion_budget,
)
from millm.v1.serving.parts import ServingParts
from millm.v1.serving.prechecks import Prechecked, precheck
from millm.v1.serving.prompts import completion_prompts, conversation_prompts
from millm.v1.serving.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    GenerationFields,
    SamplingFields,
)
from millm.v1.serving.replies import Admitted, Reply, Report
from millm.v1.serving.scoring import (
    InvalidScoringRequest,
    echoed_prompts,
    engine_reads,
    logprob_words,
    score_chat,
    score_completions,
)
from millm.v1.serving.tools import offer_decision, parse_tools, template_takes_tools
from millm.v1.token_logprobs import token_text


def generation_options(body: GenerationFields, n: int = 1) -> GenerationOptions:
    """The engine's view of the sampling fields (`n` choices per prompt), with OpenAI's defaults filled in."""
    sampling = SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
    )
    return GenerationOptions(
        max_tokens=body.token_budget,
        n=n,
        sampling=sampling,
        stop=body.stop_sequences,
        seed=body.seed,
        logprobs=getattr(body, "drawn_logprobs", None),
    )


def unused_fields(
    strict: bool,
    body: BaseModel,
    scoring: bool,
    lm: LoadedModel,
    unused: tuple[str, ...] = (),
    sent_as: SentAs = AS_SENT,
) -> tuple[str, ...]:
    """Fields this request sent that its path ignores on this model, plus `unused` ones (400 under
    X-miLLM-Strict), in the words of the body the client sent (`sent_as`)."""
    # An assistant's tool_calls are always rendered: by the template, or as <tool_call> blocks.
    reads = template_reads(lm.tokenizer) | {"tool_calls"}
    sent = body.model_dump(exclude_unset=True)
    locations = unused_locations(body, scoring=scoring, reads=reads) + [
        field for field in unused if sent.get(field) is not None
    ]
    locations += template_kwargs_unused(
        getattr(body, "chat_template_kwargs", None), lm.template_variables
    )
    return handle_unused(sent_as.merge(locations), strict)


def ids_text(lm: LoadedModel, ids: list[int]) -> str:
    """Token ids decoded as one text, special tokens by name (what the model read)."""
    return str(
        lm.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    )


class Serving:
    """The OpenAI generation routes over the server state."""

    def __init__(self, state: ServingParts):
        self.state = state
        self.settings = state.settings

    # routes ------------------------------------------------------------------------------------------
    async def chat(
        self,
        body: ChatCompletionRequest,
        strict: bool,
        sent_as: SentAs = AS_SENT,
        request_id: str | None = None,
    ) -> Reply:
        """Answer (or continue, or score) a conversation and each extra_messages conversation;
        `sent_as` names ignored fields in the words of the body a translated request came in, and
        `request_id` the id its client gets back, when that is not this body's (monitoring says it)."""
        # The body's own cross-field rules were checked while it was parsed (v1/serving/protocol.py).
        named = self.state.variants.named(body.model)
        body = self.state.variants.on_base(named, body)
        structured = body.structured
        if structured is not None and self.settings.enable_continuous_batching:
            raise refused_under_batching()
        tools = parse_tools(body)
        checked = await precheck(self.state, body, strict, body.scoring)
        lm = await self.state.switch.acquire(body.model)
        if body.scoring and not has_chat_template(lm.tokenizer):
            raise InvalidRequest(
                f"{lm.name} has no chat template, so there is no prompt to score; use /v1/completions with the prompt text",
                param="messages",
                code="no_chat_template",
            )
        tools, unused = offer_decision(
            tools, template_takes_tools(lm.tokenizer), lm.parameters, self.settings.prompted_tools
        )
        ignored = unused_fields(strict, body, body.scoring, lm, tuple(unused), sent_as)
        prompts = await to_thread.run_sync(conversation_prompts, lm, body, tools)
        meta = Meta.new("chatcmpl", named.served, lm.system_fingerprint)
        read = await self._read(lm, body, checked.read, prompts, "messages")
        if body.scoring:
            plan = await to_thread.run_sync(self.state.variants.scoring_plan, named, checked.dial)
            report = Report(ignored, plan, seed=body.seed)
            return await score_chat(self.state, lm, body, prompts, meta, report, read)
        plan = await to_thread.run_sync(self._plan, body.profile, checked, named)
        constraint = (
            structured.spec
            if structured is not None
            else tools.grammar()
            if tools is not None
            else None
        )
        if constraint is not None:
            # a schema the library refuses is a 400 now
            await to_thread.run_sync(lm.grammar.matcher, constraint)
        scope = self._seed_scope(batch_shaped=bool(body.extra_messages))
        report = Report(ignored, plan, body.seed, scope, structured)
        probes = await self._watch(lm, checked.probes)
        admitted = Admitted(lm, body, prompts, "messages", report, constraint, read, probes)
        shape = ChatShape(tools, logprob_words(lm, body))
        return await self._generate(admitted, shape, meta, request_id or meta.id)

    async def complete(self, body: CompletionRequest, strict: bool) -> Reply:
        """Continue each prompt verbatim (one choice per prompt), or score its next token."""
        named = self.state.variants.named(body.model)
        body = self.state.variants.on_base(named, body)
        checked = await precheck(self.state, body, strict, body.scoring)
        lm = await self.state.switch.acquire(body.model)
        ignored = unused_fields(strict, body, body.scoring, lm)
        error = InvalidScoringRequest if body.scoring else InvalidRequest
        prompts, texts = await to_thread.run_sync(completion_prompts, lm, body, error)
        meta = Meta.new("cmpl", named.served, lm.system_fingerprint)
        read = await self._read(lm, body, checked.read, prompts, "prompt")
        scoring_plan = (  # what scores the prompt: scoring mode, or echo's prompt logprobs
            await to_thread.run_sync(self.state.variants.scoring_plan, named, checked.dial)
            if body.scoring or body.echo
            else NO_STEERING
        )
        if body.scoring:
            report = Report(ignored, scoring_plan, seed=body.seed)
            return await score_completions(
                self.state, lm, body, (prompts, texts), meta, report, read
            )
        plan = await to_thread.run_sync(self._plan, None, checked, named)
        report = Report(ignored, plan, body.seed, self._seed_scope(batch_shaped=False))
        probes = await self._watch(lm, checked.probes)
        admitted = Admitted(lm, body, prompts, "prompt", report, None, read, probes)
        words = logprob_words(lm, body)
        echoes = (
            await echoed_prompts(self.state, body, (prompts, texts), words, scoring_plan.edit)
            if body.echo
            else None
        )
        shape = CompletionShape(texts, admitted.choices, words, echoes)
        return await self._generate(admitted, shape, meta, meta.id)

    async def embed(self, body: EmbeddingRequest, strict: bool) -> Reply:
        """Embed each input (never steered)."""
        return await embed(self.state, body, strict)

    # steps -------------------------------------------------------------------------------------------
    async def _generate(
        self, admitted: Admitted, shape: Shape, meta: Meta, request_id: str
    ) -> Reply:
        """Admit the rows (steered by the report's plan, watched by its probes and the plan's
        conditions; monitoring names them `request_id`) and answer whole or as a stream."""
        probes = admitted.probes.with_conditions(
            admitted.report.plan.watches, admitted.lm.tokenizer
        )
        admitted = replace(admitted, probes=probes)
        origin = Origin(
            request_id,
            meta.model,
            admitted.prompts,
            admitted.choices,
            partial(ids_text, admitted.lm),
        )
        stream, rows = self._start(admitted, origin)
        report = admitted.report
        if admitted.body.stream:
            return Reply(report, chunks=chunks(stream, rows, admitted, shape, meta))
        result = await collect(stream, rows, probes, admitted.choices)
        if report.structured is not None:
            for index, (text, reason) in enumerate(
                zip(result.texts, result.finish_reasons, strict=True)
            ):
                if reason == "stop":
                    validate_output(report.structured, text, index)
        return Reply(report, body=shape.whole(meta, result, admitted.prompt_tokens, admitted.read))

    def _start(self, admitted: Admitted, origin: Origin) -> tuple[JobStream, int]:
        """Build the request's rows (read by monitoring too when it is on, as `origin`'s) and admit them."""
        lm, probes = admitted.lm, admitted.probes
        reads = engine_reads(admitted.read)
        monitored = self.state.monitor.read_for(
            self.state.steering.attached,
            origin,
            partial(self.state.calibrations.table, model=lm.name),
        )
        if monitored is not None:
            reads += (monitored[0],)
        options = generation_options(admitted.body, admitted.choices)
        fill = RowFill(admitted.report.plan.edit, admitted.constraint, reads, probes.watches)
        rows = build_rows(
            lm, admitted.prompts, options, self.settings.default_max_tokens, admitted.param, fill
        )
        stream = JobStream(
            rows,
            on_monitored=monitored[1] if monitored is not None else None,
            monitored_probes=probes.active,
        )
        self.state.switch.submit(stream.job)
        return stream, len(rows)

    def _plan(self, profile: str | None, checked: Prechecked, named: Named) -> Plan:
        """The request's steering plan: a variant's steering, else its own `steering` if sent, else
        its profile or the base, through its dial."""
        if named.variant is not None:
            return self.state.variants.plan(named.variant, checked.dial)
        if checked.spec is not None:
            return self.state.planner.plan_for_spec(checked.spec, checked.dial)
        return self.state.planner.plan_for(profile, checked.dial)

    async def _read(
        self,
        lm: LoadedModel,
        body: SamplingFields,
        asked: ReadRequest | None,
        prompts: list[list[int]],
        param: str,
    ) -> ActivationRead | None:
        """The request's SAE read bound to an attached SAE (400 before anything runs), with the
        SAE's labels when it asked for them; None when it asked for none."""
        if asked is None:
            return None
        scoring = bool(getattr(body, "scoring", False))
        budget = (
            0
            if scoring
            else completion_budget(
                lm, len(prompts[0]), body.token_budget, self.settings.default_max_tokens, param
            )
        )
        read = plan_read(
            asked,
            self.state.steering.attached,
            prompt_tokens=len(prompts[0]),
            max_tokens=budget,
            max_entries=self.settings.sae_activations_max_entries,
            calibration=partial(self.state.calibrations.table, model=lm.name),
            words=partial(token_text, lm),
        )
        if not read.labels_asked:
            return read
        # Labels may be read from the store: not on the event loop.
        labels = await to_thread.run_sync(self.state.labels.entries, read.attached.info.id)
        return read.with_labels(labels)

    async def _watch(self, lm: LoadedModel, asked: tuple[Asked, ...]) -> ProbeSet:
        """The request's probes and the active ones as watches (binding them is blocking work; most requests have none)."""
        if not asked and not self.state.probes.any_active():
            return NO_PROBES
        # one view of the SAEs for every probe of the request
        attached = dict(self.state.steering.attached)
        return await to_thread.run_sync(
            watch_request, self.state.probes, self.state.calibrations, attached, lm, asked
        )

    def _seed_scope(self, batch_shaped: bool) -> str:
        """The promise X-miLLM-Seed states: extra_messages rows hold for the same batch composition;
        with continuous batching enabled the spec's promise is best-effort (the seeded request itself
        still runs on the serial path, in its own forward passes)."""
        if batch_shaped:
            return "batch-shape"
        return "best-effort" if self.settings.enable_continuous_batching else "request"
