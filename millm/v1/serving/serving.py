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

from millm.engine.jobs import EmbeddingJob, EmbeddingsReady
from millm.engine.loader import LoadedModel
from millm.engine.prompts import has_chat_template
from millm.engine.sampling import SamplingParams
from millm.errors import InvalidRequest
from millm.kernel.monitoring.requests import Origin, batch_line
from millm.kernel.probes.watches import NO_PROBES, Asked, ProbeSet, watch_request
from millm.kernel.steering.plan import NO_STEERING, Plan
from millm.kernel.variants.naming import Named
from millm.v1.policy.field_policy import (
    AS_SENT,
    SentAs,
    handle_unused,
    unused_locations,
    unused_on_model,
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
from millm.v1.serving.embeddings import embedding_list
from millm.v1.serving.generation import (
    GenerationOptions,
    JobStream,
    RowFill,
    answered,
    build_rows,
    collect,
    completion_budget,
)
from millm.v1.serving.http_replies import steering_header
from millm.v1.serving.parts import ServingParts
from millm.v1.serving.prechecks import Prechecked, precheck
from millm.v1.serving.prompts import completion_prompts, conversation_prompts, embedding_inputs
from millm.v1.serving.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    GenerationFields,
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
from millm.v1.serving.tools import offer_decision, template_takes_tools
from millm.v1.token_logprobs import token_text


def generation_options(body: GenerationFields, n: int = 1) -> GenerationOptions:
    """The engine's view of the sampling fields (`n` choices per prompt), with OpenAI's defaults
    filled in."""
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


def ids_text(lm: LoadedModel, ids: list[int]) -> str:
    """Token ids decoded as one text, special tokens by name (what the model read)."""
    return str(
        lm.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    )


def sensed_text(lm: LoadedModel, ids: list[int]) -> str:
    """Token ids as a sensing event's context shows them: special tokens left out."""
    return str(
        lm.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    )


class Serving:
    """The OpenAI generation routes over the server state."""

    def __init__(self, state: ServingParts):
        self.state = state
        self.settings = state.settings

    # routes ---------------------------------------------------------------------------------------
    async def chat(
        self,
        body: ChatCompletionRequest,
        strict: bool,
        sent_as: SentAs = AS_SENT,
        request_id: str | None = None,
        may_load: bool = True,
    ) -> Reply:
        """Answer (or continue, or score) a conversation and each extra_messages conversation;
        `sent_as` names ignored fields in the words of the body a translated request came in, and
        `request_id` the id its client gets back, when that is not this body's (monitoring says
        it); `may_load: False` refuses a model that is not loaded rather than load it."""
        # The body's own rules (millm's fields included) were checked while it was parsed.
        named = self.state.variants.named(body.model)
        body = self.state.variants.on_base(named, body)
        structured = body.structured
        if structured is not None and self.settings.enable_continuous_batching:
            raise refused_under_batching()
        checked = await precheck(self.state, body, strict, body.scoring)
        lm = await self.state.switch.acquire(body.model, may_load)
        if body.scoring and not has_chat_template(lm.tokenizer):
            raise InvalidRequest(
                f"{lm.name} has no chat template, so there is no prompt to score; use "
                "/v1/completions with the prompt text",
                param="messages",
                code="no_chat_template",
            )
        tools, unused = offer_decision(
            body.tool_plan,
            template_takes_tools(lm.tokenizer),
            lm.parameters,
            self.settings.prompted_tools,
        )
        ignored = unused_on_model(strict, body, body.scoring, lm, tuple(unused), sent_as)
        prompts = await to_thread.run_sync(conversation_prompts, lm, body, tools)
        # From here the request travels whole: its model, prompts and report, then its read.
        # A scoring pass is one forward pass of its own; extra_messages rows hold their seed for
        # the same batch composition only.
        scope = (
            "request"
            if body.scoring
            else "batch-shape"
            if body.extra_messages
            else self._seed_scope
        )
        report = Report(ignored, seed=body.seed, seed_scope=scope, structured=structured)
        admitted = Admitted(lm, body, prompts, "messages", report)
        admitted = replace(admitted, read=await self._read(admitted, checked.read))
        meta = Meta.new("chatcmpl", named.served, lm.system_fingerprint)
        if body.scoring:
            plan = await to_thread.run_sync(self.state.variants.scoring_plan, named, checked.dial)
            return await score_chat(self.state, admitted.planned(plan), meta)
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
        admitted = replace(
            admitted.planned(plan),
            constraint=constraint,
            probes=await self._watch(lm, checked.probes),
        )
        shape = ChatShape(tools, logprob_words(admitted))
        return await self._generate(admitted, shape, meta, request_id or meta.id)

    async def complete(self, body: CompletionRequest, strict: bool, may_load: bool = True) -> Reply:
        """Continue each prompt verbatim (one choice per prompt), or score its next token."""
        named = self.state.variants.named(body.model)
        body = self.state.variants.on_base(named, body)
        checked = await precheck(self.state, body, strict, body.scoring)
        lm = await self.state.switch.acquire(body.model, may_load)
        ignored = unused_on_model(strict, body, body.scoring, lm)
        error = InvalidScoringRequest if body.scoring else InvalidRequest
        prompts, texts = await to_thread.run_sync(completion_prompts, lm, body, error)
        scope = "request" if body.scoring else self._seed_scope
        admitted = Admitted(
            lm, body, prompts, "prompt", Report(ignored, seed=body.seed, seed_scope=scope)
        )
        admitted = replace(admitted, read=await self._read(admitted, checked.read))
        meta = Meta.new("cmpl", named.served, lm.system_fingerprint)
        scoring_plan = (  # what scores the prompt: scoring mode, or echo's prompt logprobs
            await to_thread.run_sync(self.state.variants.scoring_plan, named, checked.dial)
            if body.scoring or body.echo
            else NO_STEERING
        )
        if body.scoring:
            return await score_completions(self.state, admitted.planned(scoring_plan), texts, meta)
        plan = await to_thread.run_sync(self._plan, body.profile, checked, named)
        admitted = replace(admitted.planned(plan), probes=await self._watch(lm, checked.probes))
        words = logprob_words(admitted)
        echoes = (
            await echoed_prompts(self.state, body, (prompts, texts), words, scoring_plan.edit)
            if body.echo
            else None
        )
        shape = CompletionShape(texts, admitted.choices, words, echoes)
        return await self._generate(admitted, shape, meta, meta.id)

    async def embed(self, body: EmbeddingRequest, strict: bool, may_load: bool = True) -> Reply:
        """Each input's last hidden layer pooled (mean over its real tokens, its last or its first
        token's), normalised when asked."""
        # Embeddings are never steered: a variant's are its base's, answered under the variant's
        # name.
        named = self.state.variants.named(body.model)
        body = self.state.variants.on_base(named, body)
        await precheck(self.state, body, strict)
        # What embeddings ignore does not depend on the model: reported (or refused) before it is
        # held.
        ignored = handle_unused(unused_locations(body), strict)
        lm = await self.state.switch.acquire(body.model, may_load)
        prompts = await to_thread.run_sync(embedding_inputs, lm, body.input)
        ready = await answered(
            self.state.switch.submit,
            EmbeddingsReady,
            lambda emit: EmbeddingJob(prompts=prompts, emit=emit, pooling=body.pooling or "mean"),
        )
        vectors = ready.vectors
        tokens = sum(len(p) for p in prompts)
        answer = await to_thread.run_sync(
            embedding_list,
            vectors.numpy(),
            body.encoding_format,
            named.served,
            tokens,
            bool(body.normalize),
        )
        return Reply(Report(ignored), body=answer)

    # steps ----------------------------------------------------------------------------------------
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
            batch_line.get(),
        )
        stream, rows = self._start(admitted, origin)
        report = admitted.report
        if admitted.body.stream:
            report = replace(report, in_stream=True)
            said = partial(self._steering_said, report.plan)
            return Reply(report, chunks=chunks(stream, rows, admitted, shape, meta, said))
        result = await collect(stream, rows, probes, admitted.choices)
        report = replace(report, changed=await self._moved(report.plan))
        if report.structured is not None:
            for index, (text, reason) in enumerate(
                zip(result.texts, result.finish_reasons, strict=True)
            ):
                if reason == "stop":
                    validate_output(report.structured, text, index)
        return Reply(report, body=shape.whole(meta, result, admitted.prompt_tokens, admitted.read))

    async def _moved(self, plan: Plan) -> bool:
        """Whether the steering state moved while a request steered by `plan` ran."""
        return await to_thread.run_sync(self.state.planner.moved, plan)

    async def _steering_said(self, plan: Plan) -> str:
        """X-miLLM-Steering's value at a stream's end."""
        return steering_header(plan, await self._moved(plan))

    def _start(self, admitted: Admitted, origin: Origin) -> tuple[JobStream, int]:
        """Build the request's rows (read by monitoring too when it is on, as `origin`'s) and
        admit them."""
        lm, probes = admitted.lm, admitted.probes
        reads = engine_reads(admitted.read)
        monitored = self.state.monitor.read_for(
            self.state.steering.attached,
            origin,
            partial(self.state.calibrations.table, model=lm.name),
        )
        if monitored is not None:
            reads += (monitored[0],)
        sensed = self.state.sensing.read_for(origin, partial(sensed_text, lm))
        if sensed is not None:
            reads += sensed.reads
        options = generation_options(admitted.body, admitted.choices)
        fill = RowFill(admitted.report.plan.edit, admitted.constraint, reads, probes.watches)
        rows = build_rows(
            lm, admitted.prompts, options, self.settings.default_max_tokens, admitted.param, fill
        )
        stream = JobStream(
            rows,
            on_monitored=monitored[1] if monitored is not None else None,
            monitored_probes=probes.active,
            on_sensed=sensed.on_row if sensed is not None else None,
            sensing_reads=len(sensed.reads) if sensed is not None else 0,
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

    async def _read(self, admitted: Admitted, asked: ReadRequest | None) -> ActivationRead | None:
        """The request's SAE read bound to an attached SAE (400 before anything runs), with the
        SAE's labels when it asked for them; None when it asked for none."""
        if asked is None:
            return None
        lm, body, prompt_tokens = admitted.lm, admitted.body, len(admitted.prompts[0])
        budget = (
            0
            if body.scoring
            else completion_budget(
                lm,
                prompt_tokens,
                body.token_budget,
                self.settings.default_max_tokens,
                admitted.param,
            )
        )
        read = plan_read(
            asked,
            self.state.steering.attached,
            prompt_tokens=prompt_tokens,
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
        """The request's probes and the active ones as watches (binding them is blocking work;
        most requests have none)."""
        if not asked and not self.state.probes.any_active():
            return NO_PROBES
        # one view of the SAEs for every probe of the request
        attached = dict(self.state.steering.attached)
        return await to_thread.run_sync(
            watch_request, self.state.probes, self.state.calibrations, attached, lm, asked
        )

    @property
    def _seed_scope(self) -> str:
        """The promise X-miLLM-Seed states: with continuous batching enabled the spec's promise is
        best-effort (the seeded request itself still runs on the serial path, in its own forward
        passes)."""
        return "best-effort" if self.settings.enable_continuous_batching else "request"
