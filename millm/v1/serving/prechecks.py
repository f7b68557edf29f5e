"""Refusals that depend only on the request, made before the named model is acquired.

A request naming a registered model that is not loaded makes the server load it, unloading the
model everyone else uses. So every refusal the request alone decides runs first: the syntax of
millm's own fields (`steering`, `return_sae_activations`, `probes`, `tools`) as the body is
parsed (v1/serving/protocol.py), then here the fields strict mode would refuse whatever the
model, the steering_intensity syntax, an unknown profile or probe, the read's top_k limit: a bad
request never moves a model. What depends on the model (its chat template, its vocabulary, its
context window, the SAEs attached to it) is checked once it is held. How many rows a request
makes (conversations or prompts times n; a comparison makes one per variant) is the request's
own: past MAX_ROWS_PER_REQUEST it is refused here. The X-miLLM-Strict header itself is read by
the API, before this.
"""

from __future__ import annotations

from dataclasses import dataclass

from anyio import to_thread
from pydantic import BaseModel

from millm.errors import InvalidRequest
from millm.formats.profiles import spec_dict
from millm.interp.intensity import Dial, parse_dial
from millm.kernel.probes.watches import Asked, parse_probes
from millm.v1.policy.body_fields import RowCount
from millm.v1.policy.field_policy import TEMPLATE_KEYS, handle_unused, unused_locations
from millm.v1.serving.activations import ReadRequest, within_top_k
from millm.v1.serving.parts import ServingParts


@dataclass(frozen=True)
class Prechecked:
    """What the early checks parsed, for the rest of the request to use."""

    strict: bool
    dial: Dial | None = None
    read: ReadRequest | None = None  # return_sae_activations, its syntax checked
    probes: tuple[Asked, ...] = ()  # the probes the request names or defines
    spec: dict | None = None  # the request's own `steering`, canonical


async def precheck(
    state: ServingParts, body: BaseModel, strict: bool, scoring: bool = False
) -> Prechecked:
    """The request-only refusals (400/404) in the order a client would fix them; returns what
    they parsed."""
    check_rows(body, state.settings.max_rows_per_request)
    check_inputs(body, state.settings.embeddings_max_inputs)
    if strict:
        # As if the template read every optional message key: what is still unused is unused on any
        # model.
        handle_unused(unused_locations(body, scoring=scoring, reads=set(TEMPLATE_KEYS)), True)
    raw_dial = getattr(body, "steering_intensity", None)
    dial = parse_dial(raw_dial) if raw_dial is not None else None
    profile = getattr(body, "profile", None)
    if profile is not None and not scoring and not (dial is not None and dial.off):
        # "off" turns steering off without looking at the base, an unknown profile included.
        await to_thread.run_sync(state.profiles.find, profile)
    asked = getattr(body, "return_sae_activations", None)
    read = within_top_k(asked, state.settings.sae_activations_max_top_k) if asked else None
    probes = getattr(body, "probes", None)
    watched = (
        await to_thread.run_sync(parse_probes, state.probes, probes)
        if probes and not scoring
        else ()
    )
    own = getattr(body, "steering", None)
    return Prechecked(strict, dial, read, watched, spec_dict(own) if own is not None else None)


def check_inputs(body: BaseModel, cap: int) -> None:
    """400 when an embeddings request has more inputs than `cap` (MILLM_EMBEDDINGS_MAX_INPUTS)."""
    count: int | None = getattr(body, "input_count", None)
    if count is not None and count > cap:
        raise InvalidRequest(
            f"input has {count} items; the limit is {cap} (MILLM_EMBEDDINGS_MAX_INPUTS): split "
            "it into several requests",
            param="input",
        )


def check_rows(body: BaseModel, cap: int) -> None:
    """400 when the request's rows (conversations or prompts, times n; a comparison's variants)
    exceed `cap`, naming the field that multiplies them."""
    rows: RowCount | None = getattr(body, "row_count", None)
    if rows is None:
        return  # embeddings: one pass over all inputs, no rows
    n = getattr(body, "n", None) or 1
    units, param, what = rows.units, rows.param, rows.what
    if units * n > cap:
        raise InvalidRequest(
            f"this request makes {units * n} rows ({units} {what} x n={n}); this server takes at "
            f"most {cap} per request (MAX_ROWS_PER_REQUEST): split it into several requests",
            param=param if units > 1 else "n",
        )
