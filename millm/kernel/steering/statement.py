"""What steered a request, in the original miLLM's `X-miLLM-Steering` grammar: a list of members,
each a kind with its parameters in the grammar's order, then millm's own facts.

- `none`: `changed`?; millm's `reason`, `profile`, `unattached`, `variant`, `unsynced` where
  they apply.
- `profile`: `name`, `source` (`request` or `active`), `intensity`, `sae`, `layer`, `features`,
  `hash`, `clamped`?, `changed`?; millm's `base=cluster` for a cluster, `when`, `version`, ...
- `inline` (the request's own `steering`): `sae`, `layer`, `features`, `hash`, `clamped`?,
  `changed`?; then millm's.
- `manual` (the live values): `sae`, `layer`, `features`, `hash`, `changed`?; then millm's.
- `circuit` (one per active circuit, by id): `id`, `intensity`, `composed`? (it shares a layer with
  another), `changed`?; millm's `name`, `mode`, `version`.
- `compare` (millm's own): `variants`; a comparison's body says what steered each variant.

A member per applied set (plan.applied: one SAE, or a steering vector, which has `vector` for
`sae`), a member per probe that ends the rows (`abort`), ordered circuits first, then by layer,
then by SAE. Derived from the plan that steered the request, never echoed from the request: an
immutable plan is what the engine applied. millm never answers `unknown`: it always knows its
plan, on the llama.cpp engine too.
"""

from __future__ import annotations

from millm.interp.steering_hash import AppliedSet
from millm.kernel.steering.plan import Plan

Member = tuple[str, dict[str, object]]

# millm's facts a member carries after the original's parameters, in this order.
_MILLM_FACTS = ("reason", "profile", "variant", "mode", "version", "unattached", "unsynced")


def statement(plan: Plan, changed: bool = False) -> list[Member]:
    """The members of X-miLLM-Steering for a request steered by `plan`; `changed` when the
    steering state moved while it ran (on every member)."""
    facts = dict(plan.params)
    extra = {key: facts[key] for key in _MILLM_FACTS if key in facts}
    if plan.kind == "cluster":
        extra = {"base": Token("cluster"), **extra}
    moved: dict[str, object] = {"changed": True} if changed else {}
    if plan.kind == "compare":  # POST /api/compare: each variant's steering is in its body
        return [("compare", facts)]
    if plan.kind == "circuit":
        return [
            _circuit(part, moved, extra)
            for part in sorted(plan.parts or (plan,), key=lambda p: p.base_id or "")
        ]
    kind, source = _kind(plan)
    members = [
        (kind, {**source, **_applied(applied), **moved, **_where(applied), **extra})
        for applied in sorted(plan.applied, key=lambda a: (a.layer, a.vector, a.target))
    ]
    members += [(kind, {**source, "abort": probe, **moved, **extra}) for probe in plan.aborts]
    if not members:
        return [("none", {**moved, **extra})]
    return members


def _circuit(part: Plan, moved: dict[str, object], extra: dict[str, object]) -> Member:
    """One circuit's member: its id, λ, whether it shares a layer, then millm's facts."""
    facts = dict(part.params)
    head: dict[str, object] = {"id": part.base_id or "", "intensity": repr(float(part.level))}
    if part.composed:
        head["composed"] = True
    mine = {k: facts[k] for k in ("mode",) if k in facts}
    return ("circuit", {**head, **moved, "name": facts.get("name", ""), **mine, **extra})


def _kind(plan: Plan) -> tuple[str, dict[str, object]]:
    """The member kind and its leading parameters (a profile's name, source and λ)."""
    facts = dict(plan.params)
    if plan.kind == "live":
        return "manual", {}
    if plan.kind == "request":
        return "inline", {}
    source = "request" if facts.get("scope") == "request" or "variant" in facts else "active"
    lead = {"name": facts.get("name", ""), "source": Token(source)}
    lead["intensity"] = repr(float(plan.level))
    return "profile", lead


def _applied(applied: AppliedSet) -> dict[str, object]:
    target = {"vector": applied.target} if applied.vector else {"sae": applied.target}
    params: dict[str, object] = {
        **target,
        "layer": applied.layer,
        "features": applied.features,
        "hash": applied.hash,
    }
    if applied.clamped:
        params["clamped"] = applied.clamped
    return params


def _where(applied: AppliedSet) -> dict[str, object]:
    return {"when": applied.when} if applied.when is not None else {}


class Token(str):
    """A value written as an RFC 8941 token (source=request), not a string."""
