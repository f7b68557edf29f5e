"""What discovery offers the routes: inspect a text, contrast two sets, read a text through the
logit lens. Each reads through attached SAEs on the loaded model; none changes what is stored."""

from __future__ import annotations

from anyio import to_thread

from millm.engine.lens import lens_reads, read_lens_head
from millm.errors import InvalidRequest
from millm.lab.discovery.contrast import aggregate_read, contrast_prompts, contrast_result, per_text
from millm.lab.discovery.inputs import (
    attached_sae,
    check_set_sizes,
    check_steering_request,
    model_to_read,
    registered_sae,
    resolve_steering,
)
from millm.lab.discovery.inspection import inspect_prompt, inspection_answer, summarise
from millm.lab.discovery.lens import chosen_layers, lens_answer
from millm.lab.discovery.lens_protocol import LensRequest, LensResponse
from millm.lab.discovery.parts import DiscoveryParts
from millm.lab.discovery.protocol import (
    ContrastRequest,
    ContrastResponse,
    InspectRequest,
    InspectResponse,
    SteeringUsed,
)
from millm.lab.discovery.reads import discovery_read, read_passes


class Discovery:
    """The discovery routes' one way in."""

    def __init__(self, state: DiscoveryParts):
        self.state = state

    async def inspect(self, sae_id: str, body: InspectRequest) -> InspectResponse:
        """POST /api/saes/{id}/inspect: the features that fire on the text, with labels, and the
        asked feature per token."""
        info = registered_sae(self.state, sae_id, body.feature)
        await to_thread.run_sync(check_steering_request, self.state, body.steering)
        lm = await self.state.switch.acquire(model_to_read(self.state, body.model))
        attached = attached_sae(self.state, info, lm)
        prompt = await to_thread.run_sync(
            inspect_prompt, lm, body, self.state.settings.discovery_max_tokens
        )
        steered = await to_thread.run_sync(resolve_steering, self.state, body.steering, attached)
        answered = await read_passes(
            self.state, [prompt], (discovery_read(attached, summarise(body.feature)),), steered.edit
        )
        return await to_thread.run_sync(
            inspection_answer,
            self.state,
            lm,
            attached,
            prompt,
            answered.reads[0].encoded,
            body,
            steered,
        )

    async def contrast(self, sae_id: str, body: ContrastRequest) -> ContrastResponse:
        """POST /api/saes/{id}/contrast: the features that best separate set a from set b, with
        labels."""
        info = registered_sae(self.state, sae_id)
        check_set_sizes({"a": body.a, "b": body.b}, self.state.settings.discovery_max_texts)
        await to_thread.run_sync(check_steering_request, self.state, body.steering)
        lm = await self.state.switch.acquire(model_to_read(self.state, body.model))
        attached = attached_sae(self.state, info, lm)
        a, b, read_a, read_b = await to_thread.run_sync(
            contrast_prompts, lm, body, self.state.settings.discovery_max_tokens
        )
        steered = await to_thread.run_sync(resolve_steering, self.state, body.steering, attached)
        answered = await read_passes(
            self.state, a + b, (aggregate_read(attached, body.aggregate),), steered.edit
        )
        values = per_text(answered, len(a) + len(b))
        result = await to_thread.run_sync(
            contrast_result,
            self.state.saes.labels,
            info.id,
            values[: len(a)],
            values[len(a) :],
            body.aggregate,
            body.top_k,
        )
        return ContrastResponse(
            model=lm.name,
            sae_id=info.id,
            layer=attached.layer,
            aggregate=body.aggregate,
            steered=steered.edit is not None,
            steering=SteeringUsed(kind=steered.kind, params=steered.params),
            a=read_a,
            b=read_b,
            favouring_a=result.favouring_a,
            favouring_b=result.favouring_b,
        )

    async def lens(self, body: LensRequest) -> LensResponse:
        """What each chosen block predicts at each position, beside the model's final prediction."""
        await to_thread.run_sync(check_steering_request, self.state, body.steering)
        lm = await self.state.switch.acquire(model_to_read(self.state, body.model))
        prompt = await to_thread.run_sync(
            inspect_prompt, lm, body, self.state.settings.discovery_max_tokens
        )
        layers = chosen_layers(lm, body, len(prompt))
        steered = await to_thread.run_sync(resolve_steering, self.state, body.steering, None)
        await to_thread.run_sync(read_lens_head, lm)
        try:
            reads = lens_reads(lm, layers, body.top_k)
        except ValueError as exc:
            raise InvalidRequest(f"no logit lens for {lm.name}: {exc}", param="model") from None
        answered = await read_passes(self.state, [prompt], reads, steered.edit)
        table = answered.reads[-1].encoded
        return await to_thread.run_sync(lens_answer, lm, prompt, table, body, steered)
