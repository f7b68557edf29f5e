"""What an active cluster or circuit with sensing switched on senses, against the attached SAEs:
a cluster's members with their thresholds and quorum, a circuit's edges with their endpoints'
thresholds (and the edges it cannot sense, with why). Arming a cluster that cannot be sensed is a
400 naming the problem; a circuit arms with the edges it can sense and lists the others.

Thresholds come from the document's `max_activation` of each member (interp/sensing.py), with ε
and the floor from this server's settings, the document's `cluster_meta.sensing` over them, and
the base's own sensing config over both (an ε at or below 0, or a negative floor, is ignored).
"""

from __future__ import annotations

from dataclasses import dataclass

from millm.errors import InvalidRequest
from millm.formats.mistudio import RUNG_LANGUAGE
from millm.interp.binding import BOUND, cluster_binding
from millm.interp.sensing import UNSENSABLE, member_threshold, threshold_mode
from millm.interp.steering import Attached
from millm.kernel.steering.base_fit import attached_circuit_status


@dataclass(frozen=True)
class Tuning:
    """The rules a base is sensed by: ε, the floor, the context kept, the quorum (a cluster) and
    the lag allowed (a circuit)."""

    epsilon: float
    floor: float
    context_tokens: int
    min_k: int | None = None
    max_token_lag: int = 8

    def over(self, overrides: dict) -> Tuning:
        """These rules with a document's or a config's values over them (a bad ε or floor is
        ignored)."""
        epsilon = overrides.get("epsilon")
        floor = overrides.get("theta_floor")
        return Tuning(
            epsilon if isinstance(epsilon, (int, float)) and epsilon > 0 else self.epsilon,
            floor if isinstance(floor, (int, float)) and floor >= 0 else self.floor,
            overrides.get("context_tokens", self.context_tokens),
            overrides.get("min_k", self.min_k),
            overrides.get("max_token_lag", self.max_token_lag),
        )


@dataclass(frozen=True)
class Layer:
    """One layer a base reads: its SAE, the engine's point it reads at, the features it encodes."""

    layer: int
    sae_id: str
    point: int
    features: tuple[int, ...]


@dataclass(frozen=True)
class ClusterArm:
    """An armed cluster: its members (feature, θ) at one layer and the quorum."""

    base_id: str
    name: str
    read: Layer
    thetas: tuple[float, ...]
    min_k: int
    default_min_k: int
    mode: str
    context_tokens: int

    @property
    def sensable(self) -> int:
        """Members that can fire."""
        return sum(theta != UNSENSABLE for theta in self.thetas)


@dataclass(frozen=True)
class Endpoint:
    """One end of an edge: a feature at a layer and its θ."""

    layer: int
    feature_idx: int
    theta: float


@dataclass(frozen=True)
class EdgeArm:
    """A sensed edge: its key, its ends, its evidence rung."""

    key: str
    up: Endpoint
    down: Endpoint
    rung: int

    @property
    def language(self) -> str:
        """The rung's words, verbatim."""
        return RUNG_LANGUAGE[self.rung]


@dataclass(frozen=True)
class CircuitArm:
    """An armed circuit: the edges it senses, the layers they read, the ones it cannot sense."""

    base_id: str
    name: str
    edges: tuple[EdgeArm, ...]
    reads: tuple[Layer, ...]
    unsensable: tuple[dict, ...]
    max_token_lag: int
    context_tokens: int


def arm_cluster(
    row: dict, document: dict, attached: dict[str, Attached], tuning: Tuning
) -> ClusterArm:
    """A cluster armed on the attached SAEs, or a 400 saying why it cannot be sensed."""
    binding = cluster_binding(document, attached)
    if binding.status not in BOUND or binding.sae_id is None:
        raise _refused(row, f"its layer does not bind to an attached SAE ({binding.detail})")
    target = attached[binding.sae_id]
    declared = (document.get("sae") or {}).get("n_features")
    if declared is not None and declared != target.info.d_sae:
        raise _refused(
            row,
            f"it declares sae.n_features={declared}, but {binding.sae_id} has "
            f"{target.info.d_sae} features",
        )
    members = document["members"]
    for member in members:
        if member["feature_idx"] >= target.info.d_sae:
            raise _refused(
                row,
                f"member feature {member['feature_idx']} is past the width of {binding.sae_id} "
                f"({target.info.d_sae} features)",
            )
    tuning = tuning.over((document.get("cluster_meta") or {}).get("sensing") or {})
    maxima = [member.get("max_activation") for member in members]
    thetas = tuple(member_threshold(m, tuning.epsilon, tuning.floor) for m in maxima)
    sensable = sum(theta != UNSENSABLE for theta in thetas)
    if sensable == 0:
        raise _refused(
            row,
            "no member has a max_activation and the floor is 0, so none could fire: give members "
            "max_activation, or set theta_floor above 0",
        )
    min_k = tuning.min_k if tuning.min_k is not None else sensable
    features = tuple(member["feature_idx"] for member in members)
    return ClusterArm(
        row["id"],
        row["name"],
        Layer(binding.layer, binding.sae_id, target.read_point, features),
        thetas,
        max(1, min(min_k, sensable)),
        sensable,
        threshold_mode(maxima),
        tuning.context_tokens,
    )


def _refused(row: dict, problem: str) -> InvalidRequest:
    return InvalidRequest(
        f"cluster {row['name']!r} cannot be sensed: {problem}", param="sensing", code="not_sensable"
    )


def arm_circuit(
    row: dict, document: dict, attached: dict[str, Attached], tuning: Tuning
) -> CircuitArm:
    """A circuit armed on the attached SAEs: every edge it can sense, and each other one with why
    (`layer_not_attached`, `no_activation_threshold`, `endpoint_not_a_feature`)."""
    bindings = attached_circuit_status(document, attached).bindings
    maxima = _feature_maxima(document)
    edges, unsensable = [], []
    for edge in document.get("edges") or []:
        up, down = edge.get("up") or {}, edge.get("down") or {}
        key = "{}@{}->{}@{}".format(
            up.get("feature_idx"), up.get("layer"), down.get("feature_idx"), down.get("layer")
        )
        ends, reason, detail = [], None, ""
        for end in (up, down):
            layer = end.get("layer")
            binding = bindings.get(layer) if isinstance(layer, int) else None
            if end.get("kind", "feature") != "feature" or end.get("feature_idx") is None:
                reason, detail = "endpoint_not_a_feature", "an endpoint is a cluster, not a feature"
            elif binding is None or binding.status not in BOUND or binding.sae_id is None:
                reason = "layer_not_attached"
                detail = f"no attached SAE binds layer {end.get('layer')}"
            else:
                theta = member_threshold(
                    maxima.get((end["layer"], end["feature_idx"])), tuning.epsilon, tuning.floor
                )
                if theta == UNSENSABLE:
                    reason = "no_activation_threshold"
                    detail = (
                        f"feature {end['feature_idx']} at layer {end['layer']} has no "
                        "max_activation"
                    )
                ends.append(Endpoint(end["layer"], end["feature_idx"], theta))
            if reason is not None:
                break
        if reason is not None:
            unsensable.append({"edge_key": key, "reason": reason, "detail": detail})
            continue
        edges.append(EdgeArm(key, ends[0], ends[1], int(edge.get("rung", 0))))
    reads = []
    for layer in sorted({end.layer for e in edges for end in (e.up, e.down)}):
        sae_id = bindings[layer].sae_id
        assert sae_id is not None  # bound: checked above
        features = sorted(
            {end.feature_idx for e in edges for end in (e.up, e.down) if end.layer == layer}
        )
        reads.append(Layer(layer, sae_id, attached[sae_id].read_point, tuple(features)))
    return CircuitArm(
        row["id"],
        row["name"],
        tuple(edges),
        tuple(reads),
        tuple(unsensable),
        tuning.max_token_lag,
        tuning.context_tokens,
    )


def _feature_maxima(document: dict) -> dict[tuple[int, int], float | None]:
    """(layer, feature) -> the member's max_activation, over feature refs and expanded clusters."""
    found: dict[tuple[int, int], float | None] = {}
    for member in document.get("members") or []:
        subs = (
            [member.get("feature") or {}]
            if member.get("member_kind", "feature_ref") == "feature_ref"
            else member.get("expanded_members") or []
        )
        for sub in subs:
            found[(member["layer"], sub["feature_idx"])] = sub.get("max_activation")
    return found
