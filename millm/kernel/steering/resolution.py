"""A steering spec -> the engine's terms: the edit every position gets, and the watches of its
conditions.

A spec is a profile document's steering part, or a request's own `steering` field (the same
model, document_schemas.SteeringSpec): SAE feature entries, steering vectors, and probes that
end the row. Resolving it, through the dial:

- every entry without `when` joins the row's edit: its features through their SAE
  (interp.steering.feature_edit), its vectors as an addition (strength times the unit vector)
  or a cap on it;
- the entries conditioned on one probe (with one `tokens`) make one edit, carried by a
  `steer` watch of that probe: the engine adds it from the position after the probe first fires
  (a condition whose edit would change nothing, every strength 0, is a `report` watch);
- each `abort` probe becomes an `abort` watch.

Probes and vectors live in books other modules keep; they are reached through the two small
protocols below, which the composition root wires in. A spec naming a probe or a vector that no
resolver knows is refused with a 400 naming the entry (probe_not_found, vector_not_found), as is an
SAE entry that does not fit the attached SAEs: an entry is never left out, or a partly applied spec
would pass for the whole one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from millm.engine.jobs import Watch, WatchAction
from millm.engine.loader import LoadedModel
from millm.engine.residual import Operation, ResidualEdit
from millm.errors import InvalidRequest, MillmError
from millm.interp.intensity import applied_strength
from millm.interp.operators import cap
from millm.interp.steering import Attached, FeatureOp, check_feature, feature_edit
from millm.interp.steering_hash import AppliedSet, applied_sets, scaled_ops


class ProbeResolver(Protocol):
    """The probes a spec's `when` and `abort` name (the probe book)."""

    @property
    def revision(self) -> int:
        """Moves with every change to the probes, so plans resolved before it are not reused."""
        ...

    def watch(
        self,
        name: str,
        attached: dict[str, Attached],
        action: WatchAction,
        edit: ResidualEdit | None,
        tokens: int | None,
        detector: dict | None = None,
    ) -> Watch | None:
        """The watch of probe `name` (or, given `detector`, of that detector under the name) over
        these attached SAEs doing `action` (report, steer, abort) with `edit` for `tokens`
        positions; None when there is no such probe; a MillmError when it cannot watch here (its
        SAE not attached, say)."""
        ...


class VectorResolver(Protocol):
    """The steering vectors a spec's `vectors` name (the vector book)."""

    @property
    def revision(self) -> int:
        """Moves with every change to the vectors."""
        ...

    def vector(self, vector_id: str, lm: LoadedModel | None) -> tuple[int, torch.Tensor] | None:
        """(engine point, unit vector [d] float32 on the model's device) of a vector; None when
        there is no such vector; a MillmError when it does not fit `lm` (another model, no
        model)."""
        ...


def _no_model() -> LoadedModel | None:
    return None


@dataclass(frozen=True)
class Resolvers:
    """What specs resolve their probes and vectors through (None: this server keeps none), and
    the loaded model."""

    probes: ProbeResolver | None = None
    vectors: VectorResolver | None = None
    model: Callable[[], LoadedModel | None] = _no_model

    @property
    def revision(self) -> tuple[int, int]:
        """Part of a plan's state stamp."""
        return (
            self.probes.revision if self.probes else 0,
            self.vectors.revision if self.vectors else 0,
        )


@dataclass(frozen=True)
class Steered:
    """A resolved spec: the edit of every position, the watches of its conditions, and what it
    applies (per SAE and vector, for X-miLLM-Steering) with the probes that end its rows."""

    edit: ResidualEdit | None
    watches: tuple[Watch, ...] = ()
    applied: tuple[AppliedSet, ...] = ()
    aborts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refusals:
    """How a spec's problems are reported: who it is ("profile 'calm'", "steering"), the param
    and the misfit's code."""

    who: str
    param: str
    code: str = "profile_not_applicable"

    def refuse(self, where: str, problem: str, code: str | None = None) -> InvalidRequest:
        """A 400 naming the spec and the entry."""
        return InvalidRequest(
            f"{self.who}: {where}: {problem}", param=self.param, code=code or self.code
        )


@dataclass
class _Part:
    """What one condition (or none) gathers: features per SAE, vector additions and caps."""

    features: dict[str, dict[int, FeatureOp]] = field(default_factory=dict)
    clamped: dict[str, int] = field(default_factory=dict)
    additions: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    caps: list[tuple[int, Operation]] = field(default_factory=list)
    vectors: list[AppliedSet] = field(default_factory=list)


Condition = tuple[str, int | None] | None  # (probe, tokens), or None: every position


def resolve_spec(
    spec: dict,
    attached: dict[str, Attached],
    scale: float,
    resolvers: Resolvers,
    refusals: Refusals,
) -> Steered:
    """A (valid, canonical) spec through the attached SAEs and the dial `scale` (adds only)."""
    defined = _defined_probes(spec, refusals)
    parts: dict[Condition, _Part] = {}
    named: dict[Condition, str] = {}  # each condition's first entry, to name in a refusal
    for number, entry in enumerate(spec.get("steering", [])):
        where = f"steering[{number}]"
        target = _entry_sae(attached, entry, where, refusals)
        sae_id = target.info.id
        ops = {}
        for feature in entry["features"]:
            index = _fitting_index(target, feature["index"], where, refusals)
            ops[index] = FeatureOp.of(feature)
        features, clamped = scaled_ops(ops, scale)
        named.setdefault(_condition(entry), f"{where}.when")
        part = parts.setdefault(_condition(entry), _Part())
        part.features.setdefault(sae_id, {}).update(features)
        part.clamped[sae_id] = part.clamped.get(sae_id, 0) + clamped
    if spec.get("vectors"):
        lm = resolvers.model()
        for number, entry in enumerate(spec["vectors"]):
            where = f"vectors[{number}]"
            point, unit = _vector(resolvers, entry["vector_id"], lm, where, refusals)
            named.setdefault(_condition(entry), f"{where}.when")
            part = parts.setdefault(_condition(entry), _Part())
            if entry.get("op", "add") == "add":
                strength = applied_strength(entry["strength"], 1, scale)
                part.additions.append((point, strength * unit))
                op = FeatureOp("add", strength)
            else:
                op = FeatureOp("cap", value=entry["value"])
                part.caps.append(
                    (
                        point,
                        cap(unit, entry["value"], f"vector {entry['vector_id']}", refusals.param),
                    )
                )
            when = _condition(entry)
            part.vectors.append(
                AppliedSet(
                    entry["vector_id"], point, ((0, op),), vector=True, when=when and when[0]
                )
            )
    edits = {condition: _edit(part, attached, refusals) for condition, part in parts.items()}
    watches = []
    for condition, edit in edits.items():
        if condition is not None:
            probe, tokens = condition
            if (
                edit is None
            ):  # nothing to add once it fires (every strength 0): the verdict is still reported
                watches.append(
                    _watch(
                        resolvers,
                        (probe, defined.get(probe)),
                        attached,
                        "report",
                        None,
                        None,
                        named[condition],
                        refusals,
                    )
                )
            else:
                watches.append(
                    _watch(
                        resolvers,
                        (probe, defined.get(probe)),
                        attached,
                        "steer",
                        edit,
                        tokens,
                        named[condition],
                        refusals,
                    )
                )
    for number, entry in enumerate(spec.get("abort", [])):
        watches.append(
            _watch(
                resolvers,
                (entry["probe"], defined.get(entry["probe"])),
                attached,
                "abort",
                None,
                None,
                f"abort[{number}]",
                refusals,
            )
        )
    applied = tuple(
        applied_set
        for condition, part in parts.items()
        for applied_set in (
            *applied_sets(part.features, attached, condition and condition[0], part.clamped),
            *part.vectors,
        )
    )
    aborts = tuple(entry["probe"] for entry in spec.get("abort", []))
    return Steered(edits.get(None), tuple(watches), applied, aborts)


def _defined_probes(spec: dict, refusals: Refusals) -> dict[str, dict]:
    """The probes the spec defines for itself (a `when` or `abort` with a `detector`), by name.
    A name so defined means that detector at every mention in the spec (a saved probe of the
    same name is not consulted); one name given two detectors is refused."""
    mentions = [
        (f"steering[{n}].when", entry.get("when"))
        for n, entry in enumerate(spec.get("steering", []))
    ]
    mentions += [
        (f"vectors[{n}].when", entry.get("when")) for n, entry in enumerate(spec.get("vectors", []))
    ]
    mentions += [(f"abort[{n}]", entry) for n, entry in enumerate(spec.get("abort", []))]
    defined: dict[str, dict] = {}
    for where, mention in mentions:
        if mention is None or mention.get("detector") is None:
            continue
        name, detector = mention["probe"], mention["detector"]
        if defined.setdefault(name, detector) != detector:
            raise refusals.refuse(
                f"{where}.detector",
                f"probe {name!r} is defined twice with different detectors; give each its own name",
            )
    return defined


def _condition(entry: dict) -> Condition:
    when = entry.get("when")
    return None if when is None else (when["probe"], when.get("tokens"))


def _entry_sae(
    attached: dict[str, Attached], entry: dict, where: str, refusals: Refusals
) -> Attached:
    """The attached SAE an entry steers, at the layer it names, or the 400. An entry that names
    none (the original miLLM's inline shape) steers the one SAE attached."""
    sae_id, layer = entry.get("sae_id"), entry.get("layer")
    if sae_id is None:
        if len(attached) != 1:
            found = ", ".join(f"{key} at layer {a.layer}" for key, a in sorted(attached.items()))
            raise refusals.refuse(
                where,
                f"no sae_id, and {len(attached)} SAEs are attached ({found or 'none'}): name one "
                "with sae_id",
                code="sae_not_attached" if not attached else "invalid_parameter",
            )
        return next(iter(attached.values()))
    target = attached.get(sae_id)
    if target is None:
        raise refusals.refuse(
            where, f"{sae_id} is not attached (attached: {sorted(attached) or 'none'})"
        )
    if layer is not None and layer != target.layer:
        raise refusals.refuse(
            where, f"made for {sae_id} at layer {layer}, but it is attached at layer {target.layer}"
        )
    return target


def _fitting_index(target: Attached, index: int, where: str, refusals: Refusals) -> int:
    try:
        return check_feature(target.info, index, param=refusals.param)
    except MillmError as exc:
        exc.message = f"{refusals.who}: {where}: {exc.message}"
        raise


def _edit(part: _Part, attached: dict[str, Attached], refusals: Refusals) -> ResidualEdit | None:
    """One condition's edit: its features (adds, then per SAE caps and holds), then its vectors."""
    try:
        features = feature_edit(part.features, attached, refusals.param)
    except MillmError as exc:
        exc.message = f"{refusals.who}: {exc.message}"
        raise
    additions = (features.additions if features else ()) + tuple(
        (p, v) for p, v in part.additions if bool(v.any())
    )
    operations = (features.operations if features else ()) + tuple(part.caps)
    return ResidualEdit(additions, operations) if additions or operations else None


def _vector(
    resolvers: Resolvers, vector_id: str, lm: LoadedModel | None, where: str, refusals: Refusals
) -> tuple[int, torch.Tensor]:
    found = None
    if resolvers.vectors is not None:
        try:
            found = resolvers.vectors.vector(vector_id, lm)
        except MillmError as exc:
            exc.message = f"{refusals.who}: {where}: {exc.message}"
            raise
    if found is None:
        raise refusals.refuse(
            where, f"no steering vector has the id {vector_id!r}", code="vector_not_found"
        )
    return found


def _watch(
    resolvers: Resolvers,
    named: tuple[str, dict | None],  # the probe's name, and its detector when the spec defines it
    attached: dict[str, Attached],
    action: WatchAction,
    edit: ResidualEdit | None,
    tokens: int | None,
    where: str,
    refusals: Refusals,
) -> Watch:
    probe, detector = named
    found = None
    if resolvers.probes is not None:
        try:
            found = resolvers.probes.watch(probe, attached, action, edit, tokens, detector)
        except MillmError as exc:
            exc.message = f"{refusals.who}: {where}: {exc.message}"
            raise
    if found is None:
        raise refusals.refuse(where, f"no probe is named {probe!r}", code="probe_not_found")
    return found
