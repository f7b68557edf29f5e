"""What inspect and contrast read, checked before any forward pass: the SAE, the model, the texts as
token ids within the caps, and the steering plan the caller asked for (none unless asked); and
how both answers name a feature (its label).

The checks run in the order a client would fix them: what the request alone decides (an unknown
SAE, a feature past its width, too many texts, an unknown profile) before the model is acquired;
then what needs the model (the SAE attached to it, the texts' token counts against the caps and
the context window, the steering plan). Tokenising and planning are blocking work: the callers
run these functions on a worker thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from millm.engine.loader import LoadedModel
from millm.engine.prompts import chat_prompt_ids
from millm.engine.residual import ResidualEdit
from millm.errors import ContextLengthExceeded, InvalidRequest, MillmError, ModelNotLoaded, NotFound
from millm.interp.sae_files import SAEInfo
from millm.interp.steering import Attached, check_feature, check_strength, steering_edit
from millm.kernel.parts import HasSwitch
from millm.lab.discovery.parts import DiscoveryParts
from millm.lab.discovery.protocol import DiscoveryMessage, SteerWith, TextSet
from millm.lab.discovery.reads import SKIPPED_POSITIONS
from millm.v1.serving.prompts import template_messages, token_ids

MIN_TOKENS = SKIPPED_POSITIONS + 1  # a text needs one position after the skipped attention sink


@dataclass(frozen=True)
class ReadSteering:
    """The edit a read runs with (None: unsteered) and how to describe it in the answer."""

    edit: ResidualEdit | None
    kind: str = "none"
    params: dict[str, str | int | float] = field(default_factory=dict)


NOT_STEERED = ReadSteering(None)


# before the model ---------------------------------------------------------------------------------
def registered_sae(state: DiscoveryParts, sae_id: str, feature: int | None = None) -> SAEInfo:
    """The SAE (404 sae_not_found) and, when asked, a feature within its width (400
    invalid_feature_index)."""
    info = state.saes.get(sae_id, read_through=False)  # on the event loop: memory only
    if feature is not None:
        check_feature(info, feature, param="feature")
    return info


def check_set_sizes(sets: dict[str, TextSet], cap: int) -> None:
    """Each set within MILLM_DISCOVERY_MAX_TEXTS (400 naming the set; the body's own rules give each
    set a text at least)."""
    for name, texts in sets.items():
        if texts.size > cap:
            raise InvalidRequest(
                f"{name}.{texts.field} holds {texts.size} entries; a set takes at most {cap} "
                "(MILLM_DISCOVERY_MAX_TEXTS)",
                param=f"{name}.{texts.field}",
            )


def check_steering_request(state: DiscoveryParts, steering: str | SteerWith | None) -> None:
    """What the asked plan names must exist: the profile (404 naming steering.profile), the SAEs and
    their widths, the strengths' range, and each feature once (400 naming the entry). Blocking (a
    store read)."""
    if not isinstance(steering, SteerWith):
        return
    if steering.profile is not None:
        try:
            state.profiles.find(steering.profile)
        except NotFound as exc:
            exc.param = "steering.profile"
            raise
        return
    seen = set()
    for i, entry in enumerate(steering.features or []):
        where = f"steering.features[{i}]"
        if entry.sae_id is not None:
            try:
                info = state.saes.get(entry.sae_id)
            except NotFound as exc:
                exc.param = f"{where}.sae_id"
                raise
            check_feature(info, entry.index, param=f"{where}.index")
        check_strength(entry.strength, param=f"{where}.strength")
        key = (entry.sae_id, entry.index)
        if key in seen:
            raise InvalidRequest(
                f"{where} names a feature listed before it; list each feature once", param=where
            )
        seen.add(key)


# with the model -----------------------------------------------------------------------------------
def model_to_read(state: HasSwitch, asked: str | None) -> str:
    """The model a read uses: the one asked for, else the loaded one (503 model_not_loaded when
    none is)."""
    if asked is not None:
        return asked
    lm = state.switch.lm
    if lm is None:
        raise ModelNotLoaded(
            f"no model is loaded to read with (the server is {state.switch.status.value}); retry "
            "once one is",
            param="model",
        )
    return lm.name


def attached_sae(state: DiscoveryParts, info: SAEInfo, lm: LoadedModel) -> Attached:
    """The SAE as attached to the held model, or 400 sae_not_attached."""
    attached = state.steering.attached.get(info.id)
    if attached is None:
        raise InvalidRequest(
            f"SAE {info.id} is not attached to the loaded model {lm.name!r}; attach it first "
            f"(POST /api/saes/{info.id}/attach)",
            param="sae_id",
            code="sae_not_attached",
        )
    return attached


def text_prompt(lm: LoadedModel, text: str, param: str) -> list[int]:
    """A text's token ids, as /v1/completions encodes a prompt (with the tokenizer's special
    tokens)."""
    return token_ids(lm, text, param, InvalidRequest)


def conversation_prompt(lm: LoadedModel, messages: list[DiscoveryMessage], param: str) -> list[int]:
    """A conversation's token ids through the model's chat template, as /v1/chat/completions
    renders it."""
    try:
        ids = chat_prompt_ids(lm.tokenizer, template_messages(list(messages), param))
    except MillmError as exc:
        if (
            exc.param == "messages" and param != "messages"
        ):  # the template's own complaint: say which conversation
            exc.param, exc.message = param, f"{param}: {exc.message}"
        raise
    if not ids:
        raise InvalidRequest(f"the rendered conversation {param} tokenises to nothing", param=param)
    return ids


def check_readable(lm: LoadedModel, ids: list[int], param: str) -> list[int]:
    """A text that fits the context window and has a position to read after the skipped first
    one."""
    if len(ids) > lm.context_length:
        raise ContextLengthExceeded(
            limit=lm.context_length, prompt_tokens=len(ids), max_tokens=0, param=param
        )
    if len(ids) < MIN_TOKENS:
        raise InvalidRequest(
            f"{param} is {len(ids)} token{'s' if len(ids) != 1 else ''} long; a read skips the "
            f"first position (an attention sink), so a text needs at least {MIN_TOKENS} tokens",
            param=param,
        )
    return ids


def check_total(prompts: Iterable[tuple[str, list[int]]], cap: int) -> None:
    """All texts together within MILLM_DISCOVERY_MAX_TOKENS (400 naming the entry that goes past
    it)."""
    total = 0
    for param, ids in prompts:
        total += len(ids)
        if total > cap:
            raise InvalidRequest(
                f"the texts come to more than {cap} tokens (MILLM_DISCOVERY_MAX_TOKENS) by {param} "
                f"({total} so far); send fewer or shorter texts",
                param=param,
            )


def set_prompts(lm: LoadedModel, name: str, texts: TextSet) -> list[tuple[str, list[int]]]:
    """Each entry of a set as (its field path, its readable token ids)."""
    if texts.texts is not None:
        entries = [
            (f"{name}.texts[{i}]", text_prompt(lm, text, f"{name}.texts[{i}]"))
            for i, text in enumerate(texts.texts)
        ]
    else:
        entries = [
            (
                f"{name}.conversations[{i}]",
                conversation_prompt(lm, messages, f"{name}.conversations[{i}]"),
            )
            for i, messages in enumerate(texts.conversations or [])
        ]
    return [(param, check_readable(lm, ids, param)) for param, ids in entries]


def resolve_steering(
    state: DiscoveryParts, steering: str | SteerWith | None, attached: Attached | None
) -> ReadSteering:
    """The asked plan as an edit: none; the live one (what a /v1 request would get now); a profile;
    or feature strengths on attached SAEs (the inspected one by default). Blocking: a worker
    thread."""
    if steering is None:
        return NOT_STEERED
    if steering == "live":
        plan = state.planner.plan_for(None, None)
        return (
            ReadSteering(plan.edit, plan.kind, _params(plan.params))
            if plan.edit is not None
            else NOT_STEERED
        )
    assert isinstance(steering, SteerWith)
    if steering.profile is not None:
        plan = state.planner.plan_for(steering.profile, None, promised=True)
        return (
            ReadSteering(plan.edit, plan.kind, _params(plan.params))
            if plan.edit is not None
            else NOT_STEERED
        )
    attachments = dict(state.steering.attached)
    strengths: dict[str, dict[int, float]] = {}
    for i, entry in enumerate(steering.features or []):
        sae_id = entry.sae_id or (attached.info.id if attached is not None else None)
        if sae_id is None:
            raise InvalidRequest(
                f"steering.features[{i}] names no SAE; give its sae_id",
                param=f"steering.features[{i}].sae_id",
            )
        target = attachments.get(sae_id)
        if target is None:
            raise InvalidRequest(
                f"steering.features[{i}] steers {sae_id}, which is not attached; attach it first "
                f"(POST /api/saes/{sae_id}/attach)",
                param=f"steering.features[{i}].sae_id",
                code="sae_not_attached",
            )
        check_feature(target.info, entry.index, param=f"steering.features[{i}].index")
        strengths.setdefault(sae_id, {})[entry.index] = check_strength(
            entry.strength, param=f"steering.features[{i}].strength"
        )
    edit = steering_edit(strengths, attachments)
    if edit is None:
        return NOT_STEERED
    return ReadSteering(edit, "features", {"features": sum(len(f) for f in strengths.values())})


def label_of(labels: dict[int, dict], index: int) -> str | None:
    """A feature's label from the SAE's labels (index -> entry with "label"), or None."""
    entry = labels.get(index)
    label = entry.get("label") if entry else None
    return str(label) if label is not None else None


def _params(params: tuple[tuple[str, object], ...]) -> dict[str, str | int | float]:
    return {
        key: value if isinstance(value, (str, int, float)) else str(value) for key, value in params
    }
