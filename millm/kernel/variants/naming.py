"""A request's `model` as serving uses it: a registered model, or a variant standing for its base
model under its steering.

A request naming a variant is served by the base (same weights, batch and prefix cache; the
prefix cache keys by steering) and answered under the variant's name. Its steering is the
variant's: a request may not send its own `profile` or `steering` beside it (that would replace
the steering the name promises), but its `steering_intensity` replaces the variant's dial, so
`"off"` gives the base model's answer under the variant's name. A variant whose steering no
longer fits (a profile deleted, an SAE detached, a vector of another model) is refused by name,
400 variant_unfit: it is never served unsteered.

Scoring (next-token and echo logprobs) is unsteered unless the variant's `scoring` is `steered`:
a judge naming a base model always gets the unsteered model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeVar

from pydantic import BaseModel

from millm.errors import InvalidRequest, MillmError
from millm.interp.intensity import Dial
from millm.kernel.steering.plan import NO_STEERING, Plan
from millm.kernel.steering.plans import Planner
from millm.kernel.variants.book import ParsedVariant, VariantBook

Body = TypeVar("Body", bound=BaseModel)
UNFIT = "variant_unfit"
FULL = Dial(value=1.0)


@dataclass(frozen=True)
class Named:
    """The model a request names: `served` is the name its answer carries, `variant` the variant
    it is (None for a model)."""

    served: str
    variant: ParsedVariant | None = None

    @property
    def base(self) -> str:
        """The model that runs the request."""
        return self.variant.base if self.variant is not None else self.served


class VariantRouting:
    """Turns a request's model name into its base model and a variant's plans."""

    def __init__(self, book: VariantBook, planner: Planner):
        self.book, self.planner = book, planner

    def named(self, model: str) -> Named:
        """What `model` names (memory only: safe on the event loop)."""
        return Named(model, self.book.named(model))

    def on_base(self, named: Named, body: Body) -> Body:
        """The body addressed to the base model; 400 when it sends its own steering beside a
        variant."""
        if named.variant is None:
            return body
        for field in ("profile", "steering"):
            if getattr(body, field, None) is not None:
                raise InvalidRequest(
                    f"{named.served!r} is a steered variant of {named.base!r}: its steering is "
                    f"its own. Name {named.base!r} to send {field}, or send steering_intensity to "
                    "dial the variant's",
                    param=field,
                )
        return body.model_copy(update={"model": named.base})

    def plan(self, variant: ParsedVariant, dial: Dial | None) -> Plan:
        """The variant's steering through `dial` (the request's, else the variant's own), named in
        X-miLLM-Steering; 400 variant_unfit naming the variant when it no longer fits."""
        try:  # its steering must fit whatever the dial: "off" never hides an unfit variant
            self._resolve(variant, FULL)
            plan = self._resolve(variant, dial)
        except MillmError as exc:
            raise InvalidRequest(
                f"variant {variant.name!r} cannot be served: its steering does not fit now "
                f"({exc.message}); fix it at /api/variants or name its base model",
                param="model",
                code=UNFIT,
            ) from None
        return replace(plan, params=(("variant", variant.name), *plan.params))

    def problem(self, variant: ParsedVariant) -> str | None:
        """Why the variant's steering does not fit the loaded model now, None when it does."""
        try:
            self._resolve(variant, FULL)
        except MillmError as exc:
            return exc.message
        return None

    def _resolve(self, variant: ParsedVariant, dial: Dial | None) -> Plan:
        dial = dial if dial is not None else variant.dial
        if variant.profile is not None:
            return self.planner.plan_for(variant.profile, dial, promised=True)
        return self.planner.plan_for_spec(variant.spec or {}, dial)

    def scoring_plan(self, named: Named, dial: Dial | None) -> Plan:
        """What steers a scoring request: nothing, unless it names a variant whose scoring is
        steered (then its unconditional steering: a scoring pass generates nothing for a
        condition to watch)."""
        if named.variant is None or not named.variant.steers_scoring:
            return NO_STEERING
        plan = self.plan(named.variant, dial)
        if plan.watches:
            raise InvalidRequest(
                f"variant {named.served!r} steers under probe conditions, which act on generated "
                "tokens: a scoring pass generates none, so its scoring cannot be steered (set its "
                "scoring to unsteered)",
                param="model",
                code=UNFIT,
            )
        return plan
