"""A variant's controller as a millm steering spec: the request's own `steering` field.

- `variant.set(f, v)`, a nudge: `add` at v × the feature's scale (features.py); nudges of one
  feature sum;
- a pin at v: `clamp` at v × scale;
- `set_when(f > c, edits)`: the edits' entries with a `when` naming a probe the spec defines for
  itself, feature f at c × scale;
- `abort_when(f > c)`: an `abort` probe of its own, named after the SDK's event.

A condition watches one feature against a level (`>` or `>=`: millm's probes fire at or above
their threshold). What millm's steering has no word for (`mul`, a feature pinned and nudged at
once, `<`, a feature compared with a feature, several conditions joined, a scope inside a scope,
the entropy settings) is refused with a 400 naming it; nothing is left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from millm.errors import InvalidRequest
from millm.formats.document_fields import STRENGTH_LIMIT
from millm.interp.steering import Attached
from millm.lab.ember.features import Units, attached_sae, check_index, feature_of, units_of
from millm.lab.ember.parts import EmberParts
from millm.lab.ember.protocol import ConditionalGroupIn, ControllerIn, FeatureIn, InterventionIn

ABORT_PREFIX = "abort-"  # an abort probe's name: this prefix and the SDK's event name
FIRING = (">", ">=")


def refused(param: str, problem: str) -> InvalidRequest:
    """A 400 naming the controller's part that millm cannot honour."""
    return InvalidRequest(problem, param=f"controller.{param}")


@dataclass
class _Entries:
    """One condition's (or no condition's) features per SAE: {index: op}."""

    features: dict[str, dict[int, dict]] = field(default_factory=dict)


@dataclass
class Translation:
    """A controller as a spec, and its abort probes' names with the SDK's event names."""

    spec: dict
    events: dict[str, str]  # abort probe name -> the SDK's event name

    @property
    def steers(self) -> bool:
        """Whether the controller asks for anything at all."""
        return bool(self.spec["steering"] or self.spec.get("abort"))


class ControllerReader:
    """Reads controllers against the attached SAEs and their Ember units."""

    def __init__(self, state: EmberParts):
        self.state = state

    def spec(self, controller: ControllerIn | None) -> Translation:
        """The steering spec of a controller (an empty one for none)."""
        if controller is None:
            return Translation({"steering": []}, {})
        for setting in ("nonzero_strength_threshold", "min_nudge_entropy", "max_nudge_entropy"):
            if getattr(controller, setting) is not None:
                raise refused(setting, f"{setting} is not something millm's steering has")
        entries: dict[str | None, _Entries] = {None: self._edits(controller.interventions, "")}
        conditions: dict[str, dict] = {}
        aborts: list[dict] = []
        events: dict[str, str] = {}
        for number, scope in enumerate(controller.scopes):
            where = f"scopes[{number}]"
            if scope.controller.scopes:
                raise refused(f"{where}.controller.scopes", "a condition inside a condition")
            detector = self._condition(scope.conditionals, f"{where}.conditionals")
            if scope.event_name is not None:
                if scope.controller.interventions:
                    raise refused(f"{where}.controller", "an abort scope carries no edits")
                name = ABORT_PREFIX + scope.event_name
                aborts.append({"probe": name, "detector": detector})
                events[name] = scope.event_name
                continue
            name = f"when-{number}"
            conditions[name] = detector
            entries[name] = self._edits(scope.controller.interventions, f"{where}.controller.")
        steering = [
            {
                "sae_id": sae_id,
                "features": [{"index": i, **op} for i, op in sorted(ops.items())],
                **(
                    {"when": {"probe": name, "detector": conditions[name]}}
                    if name is not None
                    else {}
                ),
            }
            for name, part in entries.items()
            for sae_id, ops in part.features.items()
        ]
        spec: dict = {"steering": steering}
        if aborts:
            spec["abort"] = aborts
        return Translation(spec, events)

    def _feature(self, feature: FeatureIn, param: str) -> tuple[Attached, Units, int]:
        sae_id, index = feature_of(feature.uuid, param)
        sae = attached_sae(self.state, sae_id, param)
        return sae, units_of(self.state, sae, param), check_index(sae, index, param)

    def _edits(self, interventions: list[InterventionIn], prefix: str) -> _Entries:
        part = _Entries()
        for number, intervention in enumerate(interventions):
            where = f"{prefix}interventions[{number}]"
            if intervention.mode not in ("nudge", "pin"):
                raise refused(
                    f"{where}.mode",
                    f"mode {intervention.mode!r}: millm's steering adds to a feature (nudge) or "
                    "holds it (pin)",
                )
            for n, feature in enumerate(intervention.features.features):
                param = f"controller.{where}.features.features[{n}]"
                sae, units, index = self._feature(feature, param)
                value = units.to_millm(index, intervention.value)
                ops = part.features.setdefault(sae.info.id, {})
                before = ops.get(index)
                if intervention.mode == "pin":
                    if before is not None:
                        raise refused(where, f"feature {index} is set twice; pin it once")
                    if value < 0:
                        raise refused(
                            f"{where}.value",
                            f"a pin at {intervention.value} holds an activation below 0, which a "
                            "feature never has",
                        )
                    ops[index] = {"op": "clamp", "value": value}
                    continue
                if before is not None and before.get("op") != "add":
                    raise refused(where, f"feature {index} is pinned and nudged; choose one")
                total = value + (before["strength"] if before else 0.0)
                if abs(total) > STRENGTH_LIMIT:
                    raise refused(
                        f"{where}.value",
                        f"a nudge of {intervention.value} on feature {index} is a strength of "
                        f"{total:.4g} in millm, past its ±{STRENGTH_LIMIT:g}",
                    )
                ops[index] = {"op": "add", "strength": total}
        return part

    def _condition(self, group: ConditionalGroupIn, where: str) -> dict:
        if len(group.conditionals) != 1:
            raise refused(
                where,
                f"{len(group.conditionals)} conditions joined by {group.operator}: millm's "
                "conditions watch one feature each",
            )
        condition = group.conditionals[0]
        here = f"{where}.conditionals[0]"
        if condition.operator not in FIRING:
            raise refused(
                f"{here}.operator",
                f"operator {condition.operator!r}: a condition fires when a feature reaches a "
                "level (> or >=)",
            )
        if isinstance(condition.right_hand, FeatureIn):
            raise refused(f"{here}.right_hand", "a feature compared with a feature")
        if len(condition.left_hand.features) != 1:
            raise refused(
                f"{here}.left_hand",
                f"{len(condition.left_hand.features)} features: a condition watches one",
            )
        if condition.right_hand <= 0:
            raise refused(
                f"{here}.right_hand",
                f"level {condition.right_hand}: a feature's activation is never below 0, so a "
                "condition needs a level above 0",
            )
        sae, units, index = self._feature(
            condition.left_hand.features[0], f"controller.{here}.left_hand.features[0]"
        )
        return {
            "type": "feature",
            "sae_id": sae.info.id,
            "index": index,
            "threshold": units.to_millm(index, condition.right_hand),
        }
