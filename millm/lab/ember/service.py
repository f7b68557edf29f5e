"""Ember's routes that read the model, over millm's services: each answer is a millm service's,
said in Ember's words (the feature routes over labels and decoders are catalogue.py's).

- chat/completions: `/v1/chat/completions` (`Serving.chat`), the controller as `steering`;
- chat-attribution/compute-features: a chat read with `return_sae_activations` over the prompt;
- chat/tokenize: the chat template's tokens, as discovery renders a conversation;
- chat-attribution/compute-logits: a generation's first `top_logprobs`;
- chat-attribution/contrast: the contrast read (`Discovery.contrast`) over the two sets;
- features/auto-edits: AutoSteer (`AutoSteer.start`), waited for;
- attributions/compute-logit-attribution: an attribution graph (`Attribution.attribute`)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TypeVar

from anyio import to_thread
from pydantic import BaseModel

from millm.errors import InvalidRequest, MillmError
from millm.kernel.runtime.jobs import JobBook
from millm.lab.attribution.protocol import AttributionRequest
from millm.lab.attribution.service import Attribution
from millm.lab.autosteer.inputs import search_words
from millm.lab.autosteer.protocol import AutoSteerRequest
from millm.lab.autosteer.service import AutoSteer
from millm.lab.discovery.inspection import token_strings
from millm.lab.discovery.protocol import ContrastRequest
from millm.lab.discovery.service import Discovery
from millm.lab.ember.answers import chat_answer, chat_chunks
from millm.lab.ember.catalogue import search_by
from millm.lab.ember.controller import ControllerReader, Translation
from millm.lab.ember.conversation import prefix_text, rendered
from millm.lab.ember.features import (
    attached_sae,
    check_index,
    feature_id,
    feature_out,
    labels_of,
    served_model,
    units_of,
)
from millm.lab.ember.parts import EmberParts
from millm.lab.ember.protocol import (
    Activation,
    Attributed,
    AttributionAnswer,
    AttributionBody,
    AutoEdits,
    ContrastAnswer,
    ContrastBody,
    ControllerIn,
    DatasetBody,
    EmberChatRequest,
    FeaturesAnswer,
    FeaturesBody,
    LogitsAnswer,
    LogitsBody,
    Message,
    SpecificationBody,
    TokenFeatures,
    TokenizeBody,
    TokenList,
    TokenText,
)
from millm.lab.labels.service import FeatureManagement
from millm.v1.objects import ChatCompletion
from millm.v1.serving.protocol import ChatCompletionRequest
from millm.v1.serving.replies import Reply
from millm.v1.serving.serving import Serving

# AutoSteer within the SDK's 60-second wait on the demo's CPU: two candidates at two strengths,
# one probe question, short answers (the full search is POST /api/autosteer).
AUTOSTEER_BUDGET = {
    "candidates": 2,
    "strength_fractions": [0.2, 0.35],
    "probe_prompts": ["Tell me about your weekend."],
    "max_tokens": 24,
}
JOB_POLL_S = 0.25
TOKEN_TOP_K = 32  # features reported per token by compute-features (Token.inspect shows 5)
MAX_LOGITS_TOP_K = 20  # OpenAI's top_logprobs bound
ATTRIBUTION_NODES = 32  # features a compute-logit-attribution graph expands (the SDK waits 10 s)
Body = TypeVar("Body", bound=BaseModel)


class Ember:
    """The Ember API's routes over millm's services."""

    def __init__(
        self,
        state: EmberParts,
        serving: Serving,
        features: FeatureManagement,
        discovery: Discovery,
        autosteer: AutoSteer,
        attribution: Attribution,
        jobs: JobBook,
    ):
        self.state, self.serving, self.features = state, serving, features
        self.discovery, self.autosteer, self.attribution = discovery, autosteer, attribution
        self.jobs = jobs
        self.controllers = ControllerReader(state)

    # chat -------------------------------------------------------------------------------------
    def _steering(
        self, model: str, controller: ControllerIn | None
    ) -> tuple[dict | None, Translation]:
        """The request's `steering` (None: none sent) and the controller's translation. A string
        model sends none (the server's steering, as /v1 gets it); a variant with no edits is the
        unsteered base, or a millm variant's own steering."""
        translation = self.controllers.spec(controller)
        if controller is None:
            return None, translation
        if not translation.steers and self.state.variants.named(model).variant is not None:
            return None, translation
        return translation.spec, translation

    def _chat_request(
        self, messages: list[Message], model: str, steering: dict | None, **fields
    ) -> ChatCompletionRequest:
        body = {"model": model, "messages": messages, **fields}
        if steering is not None:
            body["steering"] = steering
        return millm_body(ChatCompletionRequest, body, "messages")

    async def chat(self, body: EmberChatRequest, strict: bool) -> Reply:
        """An answer (or a stream) as Ember's SDK reads it, with the abort events that fired."""
        steering, translation = await to_thread.run_sync(
            self._steering, body.model, body.controller
        )
        fields = {
            key: value
            for key, value in {
                "stream": body.stream,
                "max_completion_tokens": body.max_completion_tokens,
                "top_p": body.top_p,
                "temperature": body.temperature,
                "stop": body.stop,
                "seed": body.seed,
            }.items()
            if value is not None
        }
        request = self._chat_request(body.messages, body.model, steering, **fields)
        reply = await self.serving.chat(request, strict)
        if reply.chunks is not None:
            return Reply(
                replace(reply.report, in_stream=False),
                chunks=chat_chunks(reply.chunks, translation.events),
            )
        assert isinstance(reply.body, ChatCompletion)
        return Reply(reply.report, body=chat_answer(reply.body, translation.events))

    # reads ------------------------------------------------------------------------------------
    async def compute_features(self, body: FeaturesBody) -> FeaturesAnswer:
        """Each token of the conversation with the features active there (Ember's units),
        strongest first; read as a chat request of this model and variant reads it."""
        sae = await to_thread.run_sync(attached_sae, self.state, None, "model")
        units = await to_thread.run_sync(units_of, self.state, sae, "model")
        steering, _ = await to_thread.run_sync(self._steering, body.model, body.controller)
        read: dict = {"sae_id": sae.info.id, "positions": "prompt", "tokens": True}
        if body.include_feature_indexes:
            read["features"] = [
                check_index(sae, i, f"include_feature_indexes[{n}]")
                for n, i in enumerate(body.include_feature_indexes)
            ]
            read["top_k"] = min(
                len(read["features"]), self.state.settings.sae_activations_max_top_k
            )
        else:
            read["top_k"] = TOKEN_TOP_K
        request = self._chat_request(
            body.messages,
            body.model,
            steering,
            max_completion_tokens=1,
            temperature=0,
            return_sae_activations=read,
        )
        reply = await self.serving.chat(request, False)
        assert isinstance(reply.body, ChatCompletion) and reply.body.millm is not None
        block = reply.body.millm["sae_activations"]
        tokens = []
        for entry in block["positions"]:
            attributions = (
                []
                if entry["position"] == 0  # the attention sink: its activations mean nothing
                else [
                    Activation(
                        id=feature_id(sae.info.id, f["index"]),
                        index_in_sae=f["index"],
                        activation_strength=units.to_ember(f["index"], f["value"]),
                    )
                    for f in entry["features"]
                    if f["value"] > 0
                ]
            )
            attributions.sort(key=lambda a: -a.activation_strength)  # in Ember's units
            tokens.append(TokenFeatures(token=entry.get("token", ""), attributions=attributions))
        return FeaturesAnswer(tokens=tokens)

    def tokenize(self, body: TokenizeBody) -> TokenList:
        """The conversation's tokens as the chat template renders it (the generation prompt
        included), each token's own text (blocking)."""
        lm, ids = rendered(self.state, body.messages, body.model)
        return TokenList(tokens=[TokenText(value=text) for text in token_strings(lm, ids)])

    async def logits(self, body: LogitsBody) -> LogitsAnswer:
        """The next token's top_k log-probabilities under the model or variant (a generation's
        first token, steered as the variant is): logits up to one constant, so their order and
        differences are the logits'."""
        if body.filter_vocabulary is not None:
            raise InvalidRequest(
                "filter_vocabulary is not supported: a steered next token's probabilities come "
                "from a generation, which reports the top_k tokens; ask for those",
                param="filter_vocabulary",
            )
        top_k = body.top_k if body.top_k is not None else 10
        if not 1 <= top_k <= MAX_LOGITS_TOP_K:
            raise InvalidRequest(f"top_k is 1 to {MAX_LOGITS_TOP_K}", param="top_k")
        steering, _ = await to_thread.run_sync(self._steering, body.model, body.controller)
        request = self._chat_request(
            body.messages,
            body.model,
            steering,
            max_completion_tokens=2,  # one token would be a scoring pass, which is never steered
            temperature=0,
            logprobs=True,
            top_logprobs=top_k,
        )
        reply = await self.serving.chat(request, False)
        assert isinstance(reply.body, ChatCompletion)
        logprobs = reply.body.choices[0].logprobs
        first = logprobs.content[0].top_logprobs if logprobs and logprobs.content else []
        return LogitsAnswer(logits={entry.token: entry.logprob for entry in first})

    async def contrast(self, body: ContrastBody) -> ContrastAnswer:
        """The features that favour each set of conversations, as millm's contrast ranks them
        (Cohen's d of each conversation's mean activation)."""
        served_model(self.state, body.model)
        if len(body.dataset_1) != len(body.dataset_2):
            raise InvalidRequest(
                "dataset_1 and dataset_2 are paired: give them one length", param="dataset_2"
            )
        sae = await to_thread.run_sync(attached_sae, self.state, None, "model")
        top_k = max(body.k_to_add, body.k_to_remove)
        request = millm_body(
            ContrastRequest,
            {
                "a": {"conversations": body.dataset_1},
                "b": {"conversations": body.dataset_2},
                "top_k": top_k,
                "aggregate": "mean",
            },
            "dataset_1",
        )
        answer = await self.discovery.contrast(sae.info.id, request)
        labels = await to_thread.run_sync(labels_of, self.state, sae.info.id)
        return ContrastAnswer(
            dataset_1_features=[
                feature_out(sae.info.id, f.index, labels)
                for f in answer.favouring_a[: body.k_to_remove]
            ],
            dataset_2_features=[
                feature_out(sae.info.id, f.index, labels)
                for f in answer.favouring_b[: body.k_to_add]
            ],
        )

    # searches that act ------------------------------------------------------------------------
    async def auto_edits(self, body: SpecificationBody) -> AutoEdits:
        """AutoSteer's best setting for the goal, as Ember's edits (within the SDK's wait: see
        AUTOSTEER_BUDGET); none when no setting beat the unsteered model."""
        served_model(self.state, body.model)
        sae = await to_thread.run_sync(attached_sae, self.state, None, "model")
        units = await to_thread.run_sync(units_of, self.state, sae, "model")
        # AutoSteer's own candidates come from the label search by words; Ember's search fused
        # meaning in, so its best match is tried too (when the SAE's label embeddings are made).
        words = search_words(body.specification)
        by = await to_thread.run_sync(search_by, self.features, sae)
        found = await to_thread.run_sync(self.features.search_features, sae.info.id, words, 1, by)
        request = millm_body(
            AutoSteerRequest,
            {
                "goal": body.specification,
                "sae_id": sae.info.id,
                "include": [hit.index for hit in found.data if hit.score is not None] or None,
                **AUTOSTEER_BUDGET,
            },
            "specification",
        )
        job = await to_thread.run_sync(self.autosteer.start, request)
        result = await self._finished(job.id)
        best = result.get("best")
        if best is None:  # nothing beat the unsteered model: no edits (the job keeps the evidence)
            return AutoEdits(edits=[], job=job.id)
        labels = await to_thread.run_sync(labels_of, self.state, sae.info.id)
        feature = feature_out(sae.info.id, best["index"], labels).model_dump()
        return AutoEdits(
            edits=[(feature, units.to_ember(best["index"], best["strength"]))], job=job.id
        )

    async def _finished(self, job_id: str) -> dict:
        """A job's result once it succeeds (its error as this request's when it fails); the job is
        cancelled if this request ends first."""
        try:
            while True:
                view = self.jobs.get(job_id)
                if view.state == "succeeded":
                    return view.result or {}
                if view.state in ("failed", "cancelled"):
                    error = view.error or {}
                    raise InvalidRequest(
                        f"job {job_id} {view.state}: {error.get('message', 'no reason given')}",
                        param="specification",
                        code=error.get("code") or "job_failed",
                    )
                await asyncio.sleep(JOB_POLL_S)
        except asyncio.CancelledError:
            self.jobs.cancel(job_id)
            raise

    async def attribute(self, body: AttributionBody) -> AttributionAnswer:
        """The features that drive the token at `startIndex` of the rendered conversation (its
        position as chat/tokenize counts): an attribution graph of the text before it with that
        token as its target, each feature's direct effect on the target's logit summed over its
        positions, and where it is active (Ember's units)."""
        if body.endIndex != body.startIndex:
            raise InvalidRequest(
                "a graph explains one token: give endIndex = startIndex", param="endIndex"
            )
        lm, ids = await to_thread.run_sync(rendered, self.state, body.messages, body.model)
        if not 2 <= body.startIndex < len(ids):
            raise InvalidRequest(
                f"startIndex {body.startIndex} is outside the conversation's tokens "
                f"2..{len(ids) - 1} (a graph needs two tokens before its target)",
                param="startIndex",
            )
        sae = await to_thread.run_sync(attached_sae, self.state, None, "model")
        units = await to_thread.run_sync(units_of, self.state, sae, "model")
        text = await to_thread.run_sync(prefix_text, lm, ids[: body.startIndex])
        request = millm_body(
            AttributionRequest,
            {
                "model": body.model,
                "text": text,
                "target": {"token": ids[body.startIndex]},
                "saes": [sae.info.id],
                "max_feature_nodes": ATTRIBUTION_NODES,
                "verify": 0,
            },
            "messages",
        )
        graph = await self.attribution.attribute(request)
        target = next(node.id for node in graph.nodes if node.kind == "target")
        direct: dict[str, float] = {}
        for edge in graph.edges:
            if edge.target == target:
                direct[edge.source] = direct.get(edge.source, 0.0) + edge.weight
        found: dict[int, Attributed] = {}
        for node in graph.nodes:
            if node.kind != "feature" or node.feature is None:
                continue
            entry = found.setdefault(
                node.feature,
                Attributed(id=feature_id(sae.info.id, node.feature), value=0.0, tokens=[]),
            )
            entry.value += direct.get(node.id, 0.0)
            entry.tokens.append(
                {
                    "index": node.position,
                    "activation_strength": units.to_ember(node.feature, node.activation or 0.0),
                }
            )
        return AttributionAnswer(to_ablate=list(found.values()), num_input_tokens=body.startIndex)

    def dataset(self, body: DatasetBody) -> dict:
        """Refused: millm writes no datasets of its own."""
        raise InvalidRequest(
            "millm does not write contrastive datasets: give features.contrast() conversations "
            "of your own (AutoSteer, features/auto-edits, searches for a goal without them)",
            param="specification",
            code="not_supported",
        )


def millm_body(kind: type[Body], data: dict, param: str) -> Body:
    """A millm body made from an Ember request's parts; what millm's rules refuse (a bound, a
    message's shape) is a 400 naming the Ember field it came from."""
    try:
        return kind.model_validate(data)
    except MillmError:
        raise
    except ValueError as exc:  # pydantic's
        raise InvalidRequest(f"{param}: {exc}", param=param) from None
