"""An attribution graph for one prompt and one target, computed in steps (circuit-tracer's phases).

`Tracer.start` runs the replacement pass (replacement.py) and the target's row: every node's
direct effect on the target. Each `Tracer.expand` then takes the `batch` not yet expanded
features of most influence on the target so far and computes their input rows, one batched
backward pass for the lot (autograd's is_grads_batched: the backward runs under vmap, each
batch row seeding one of them with a one-hot cotangent, over the one forward pass held since
`start`, so the pass's activations are kept once, not once per row), until `max_feature_nodes`
are expanded or no unexpanded feature has any influence left. `Tracer.finish` lays the expanded
features, the error nodes, the tokens and the target out as one adjacency matrix and prunes it
(pruning.py). Each step is short, so the service runs them as separate engine calls and serving
goes on between them.

Nodes and their writes: a feature (source, position, index) writes a·W_dec[index] (times the
decoder's output scale; a cross-layer transcoder's feature writes a·W_dec[index, k] into the MLP
output of each block from its own on), an error node (source, position) its error vector, a token
its embedding; a row's entries are those writes dotted with the gradient of the row's node at the
place each is written (summed over a feature's places). A feature's own value is its pre-activation;
the target's is Σ c_i·(logit_i − mean logit) at the last position (circuit-tracer's demeaned logit,
so a difference of two logits is c = (1, −1)). With `steps` of integrated gradients (an
attribution-patching graph only) the gradient at each source is averaged along its path
(integrated.py) instead of taken at the pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from millm.engine.residual import ResidualEdit
from millm.interp.attribution.integrated import path_gradients, point_totals
from millm.interp.attribution.pruning import Pruned, partial_influence, prune, scores
from millm.interp.attribution.replacement import FrozenPass, ReplacementModel, Source, Trace

EXACT = (
    "transcoders"  # every MLP replaced: the graph is the linearised model's exact direct effects
)
PATCHING = "attribution patching"  # some computation left non-linear: gradient x activation
INTEGRATED = "integrated gradients"  # the same, each point's gradient averaged along its path


def method_of(sources: list[Source], blocks: int, steps: int = 0) -> str:
    """EXACT when every block's MLP has a transcoder and nothing else is a source; else
    attribution patching, INTEGRATED with `steps` of integrated gradients."""
    mlp = {s.layer for s in sources if s.site == "mlp"}
    if len(mlp) == blocks and len(mlp) == len(sources):
        return EXACT
    return INTEGRATED if steps else PATCHING


@dataclass(frozen=True)
class Target:
    """Σ coefficients[i] · (logit of ids[i] − the mean logit), at the prompt's last position."""

    ids: tuple[int, ...]
    coefficients: tuple[float, ...]

    def value(self, logits: torch.Tensor) -> torch.Tensor:
        """The target's value for logits `[..., V]`."""
        index = torch.tensor(self.ids, device=logits.device)
        weights = torch.tensor(self.coefficients, dtype=logits.dtype, device=logits.device)
        centred = logits.index_select(-1, index) - logits.mean(-1, keepdim=True)
        return (centred * weights).sum(-1)


@dataclass(frozen=True)
class Budget:
    """How big a graph may grow and what pruning keeps."""

    max_feature_nodes: int = 256
    node_threshold: float = 0.8
    edge_threshold: float = 0.98
    batch: int = 32  # targets per (batched) backward pass


@dataclass(frozen=True)
class FeatureNode:
    """One active feature at one position of one source."""

    source: int  # index into the sources
    position: int
    index: int
    activation: float


@dataclass
class Graph:
    """The pruned graph. Node order: features, errors (source-major, then position), tokens,
    target; `adjacency[t, s]` is the direct effect of node s on node t."""

    prompt: list[int]
    sources: list[Source]
    target: Target
    target_value: float  # in the replacement pass (the served model's own is measured apart)
    probability: float  # of the first target token, in the replacement pass
    method: str
    features: list[FeatureNode]
    active_features: int
    adjacency: torch.Tensor
    pruned: Pruned
    replacement_score: float
    completeness_score: float

    @property
    def positions(self) -> int:
        """Prompt length."""
        return len(self.prompt)

    def kind(self, node: int) -> tuple[str, int, int]:
        """(kind, source or -1, position) of node index `node`; kind: feature, error, token,
        target."""
        features, errors = len(self.features), len(self.sources) * self.positions
        if node < features:
            feature = self.features[node]
            return "feature", feature.source, feature.position
        if node < features + errors:
            source, position = divmod(node - features, self.positions)
            return "error", source, position
        if node < features + errors + self.positions:
            return "token", -1, node - features - errors
        return "target", -1, self.positions - 1


@dataclass
class _Nodes:
    """The active features of a pass and every node's write vector."""

    features: list[FeatureNode]
    positions: list[torch.Tensor]  # per source: the positions of its active features
    # per source: a·scale·W_dec of its active features `[n_i, reach, d]`, slice k written where
    # the source `lands[i][k]` (of the trace) is injected
    writes: list[torch.Tensor]
    lands: list[list[int]]
    offsets: list[int]  # per source: its first feature's column

    @classmethod
    def of(cls, trace: Trace) -> _Nodes:
        features: list[FeatureNode] = []
        positions, writes, lands, offsets = [], [], [], []
        mlp = {s.source.layer: i for i, s in enumerate(trace.sources) if s.source.site == "mlp"}
        for index, source in enumerate(trace.sources):
            where = source.acts.nonzero()
            offsets.append(len(features))
            values = source.acts[where[:, 0], where[:, 1]]
            decoder = source.source.sae.writes(where[:, 1]).to(values.dtype)
            positions.append(where[:, 0])
            scale = source.scale[where[:, 0]][:, :, None]
            writes.append(values[:, None, None] * scale * decoder)
            layer, reach = source.source.layer, source.source.sae.reach
            lands.append([index] if reach == 1 else [mlp[layer + k] for k in range(reach)])
            features.extend(
                FeatureNode(index, int(p), int(f), float(v))
                for (p, f), v in zip(where.tolist(), values.tolist(), strict=True)
            )
        return cls(features, positions, writes, lands, offsets)


@dataclass
class Tracer:
    """The steps of one graph; every method runs on the scheduler thread."""

    model: ReplacementModel
    prompt: list[int]
    sources: list[Source]
    target: Target
    budget: Budget
    edit: ResidualEdit | None = None
    steps: int = 0  # integrated gradients' steps per point (0: the pass's own gradients)
    trace: Trace | None = None
    held: FrozenPass | None = None  # the pass's held writes, replayed along the integrated paths
    totals: list[torch.Tensor | None] | None = None  # per injection point, what its nodes write
    nodes: _Nodes | None = None
    rows: list[torch.Tensor] = field(default_factory=list)
    row_nodes: list[int] = field(default_factory=list)
    expanded: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # In the order the pass meets them: a block's transcoder before the SAE after that block.
        self.sources = sorted(self.sources, key=lambda s: (s.layer, s.site != "mlp"))
        # The published linearisation for transcoders; the model's own gradients otherwise.
        self.model.frozen = self.method == EXACT

    @property
    def columns(self) -> int:
        """Source columns of a row: features, errors, tokens."""
        assert self.nodes is not None
        return len(self.nodes.features) + (len(self.sources) + 1) * len(self.prompt)

    @property
    def method(self) -> str:
        """How the edges are computed (method_of)."""
        return method_of(self.sources, len(self.model.layout.blocks), self.steps)

    def start(self) -> None:
        """The replacement pass and the target's row."""
        with torch.inference_mode(False), torch.enable_grad():
            self.held = FrozenPass() if self.method == INTEGRATED else None
            self.trace = self.model.trace(self.prompt, 1, self.sources, self.edit, self.held)
            self.nodes = _Nodes.of(self.trace)
            if self.held is not None:
                found = self.nodes
                self.totals = point_totals(self.trace, found.positions, found.writes, found.lands)
            self.expanded = torch.zeros(len(self.nodes.features), dtype=torch.bool)
            self.rows.append(self._rows([None])[0])
            self.row_nodes.append(self.columns)  # the target's own index comes after every source

    def expand(self) -> int:
        """Compute the input rows of the next batch of most influential features; returns how many
        (0: nothing left with influence, and the tracer is done)."""
        assert self.expanded is not None and self.trace is not None
        left = min(self.budget.max_feature_nodes, len(self.expanded)) - int(self.expanded.sum())
        size = min(left, self.budget.batch)
        if size <= 0:
            return 0
        influence = self._influence()[: len(self.expanded)]
        influence[self.expanded] = -1
        ranked = torch.argsort(influence, descending=True)[:size]
        ranked = ranked[influence[ranked] > 0]
        if len(ranked) == 0:  # nothing unexpanded reaches the target
            return 0
        with torch.inference_mode(False), torch.enable_grad():
            rows = self._rows([int(i) for i in ranked])
        self.rows.extend(rows)
        self.row_nodes.extend(int(i) for i in ranked)
        self.expanded[ranked] = True
        return len(ranked)

    def finish(self) -> Graph:
        """The adjacency over expanded features, errors, tokens and the target, pruned; the pass
        is let go."""
        assert self.nodes is not None and self.trace is not None and self.expanded is not None
        chosen = torch.nonzero(self.expanded)[:, 0]
        features = len(chosen)
        others = self.columns - len(self.nodes.features)
        size = features + others + 1
        keep_columns = torch.cat([chosen, torch.arange(len(self.nodes.features), self.columns)])
        new_index = {int(old): new for new, old in enumerate(chosen.tolist())}
        adjacency = torch.zeros(size, size, dtype=torch.float64)
        for row, node in zip(self.rows, self.row_nodes, strict=True):
            at = size - 1 if node == self.columns else new_index.get(node)
            if at is not None:
                adjacency[at, : size - 1] = row[keep_columns].double()
        weights = torch.zeros(size, dtype=torch.float64)
        weights[-1] = 1.0
        always = torch.zeros(size, dtype=torch.bool)
        always[features + len(self.sources) * len(self.prompt) :] = True
        pruned = prune(
            adjacency,
            weights,
            features,
            always,
            self.budget.node_threshold,
            self.budget.edge_threshold,
        )
        errors_end = features + len(self.sources) * len(self.prompt)
        replacement, completeness = scores(
            adjacency, weights, slice(features, errors_end), slice(errors_end, size - 1)
        )
        logits = self.trace.logits[0].detach()
        value = float(self.target.value(logits))
        probability = float(torch.softmax(logits.double(), -1)[self.target.ids[0]])
        graph = Graph(
            prompt=self.prompt,
            sources=self.sources,
            target=self.target,
            target_value=value,
            probability=probability,
            method=self.method,
            features=[self.nodes.features[i] for i in chosen.tolist()],
            active_features=len(self.nodes.features),
            adjacency=adjacency,
            pruned=pruned,
            replacement_score=replacement,
            completeness_score=completeness,
        )
        self.drop()  # the pass and its autograd graph are freed here, on this thread
        return graph

    def drop(self, lm: object = None) -> None:
        """Let the pass go without a graph (a cancelled request); on the scheduler thread."""
        self.trace, self.held, self.totals = None, None, None

    def _influence(self) -> torch.Tensor:
        rows = torch.stack(self.rows).double()
        rows = torch.cat([rows, rows.new_zeros(len(rows), 1)], dim=1)  # the target's column
        seed = torch.zeros(len(self.rows), dtype=torch.float64)
        seed[0] = 1.0
        nodes = torch.tensor(self.row_nodes)
        return partial_influence(rows, nodes, seed)

    def _rows(self, nodes: list[int | None]) -> list[torch.Tensor]:
        """One backward pass: the input rows `[columns]` of each node (None: the target)."""
        assert self.trace is not None and self.nodes is not None
        trace, found = self.trace, self.nodes
        n = len(nodes)
        # Row r of the batched backward seeds node r: a one-hot cotangent on its own output.
        seeds: dict[int, torch.Tensor] = {}  # output index (-1: the target) -> `[n, *shape]`
        for row, node in enumerate(nodes):
            if node is None:
                seeds.setdefault(-1, torch.zeros(n, dtype=self.model.dtype))[row] = 1.0
                continue
            feature = found.features[node]
            pre = trace.sources[feature.source].pre
            seed = seeds.setdefault(feature.source, pre.new_zeros(n, *pre.shape))
            seed[row, 0, feature.position, feature.index] = 1.0
        grads = self._gradients(seeds)
        parts: list[torch.Tensor] = []
        for index in range(len(trace.sources)):
            part = torch.zeros(n, len(found.writes[index]), dtype=self.model.dtype)
            for k, landed in enumerate(found.lands[index]):
                grad = grads[landed + 1]
                if grad is not None:
                    at = grad[:, found.positions[index]]  # [n, n_i, d]
                    part = part + (at * found.writes[index][None, :, k]).sum(-1)
            parts.append(part)
        for index, source in enumerate(trace.sources):
            grad = grads[index + 1]
            parts.append(
                torch.zeros(n, len(self.prompt), dtype=self.model.dtype)
                if grad is None
                else (grad * source.errors[None]).sum(-1)
            )
        token_grad = grads[0]
        parts.append(
            torch.zeros(n, len(self.prompt), dtype=self.model.dtype)
            if token_grad is None
            else (token_grad * trace.embeddings[None]).sum(-1)
        )
        return list(torch.cat(parts, dim=1).detach().cpu())

    def _output(self, trace: Trace, index: int) -> torch.Tensor:
        """A seeded output of a pass: the target's value (-1) or source `index`'s
        pre-activations."""
        return self.target.value(trace.logits[0]) if index < 0 else trace.sources[index].pre

    def _gradients(self, seeds: dict[int, torch.Tensor]) -> list[torch.Tensor | None]:
        """Per injection point (the tokens', then each source's), the seeded outputs' gradient
        `[n, T, d]` there: at the pass itself, or averaged along integrated gradients' paths."""
        assert self.trace is not None
        trace = self.trace
        integrated = self.totals is not None  # set with `held`, in start
        points = [trace.z_embed] if integrated else [trace.z_embed] + [s.z for s in trace.sources]
        grads: list[torch.Tensor | None] = [
            None if grad is None else grad[:, 0]
            for grad in torch.autograd.grad(
                [self._output(trace, index) for index in seeds],
                points,
                grad_outputs=list(seeds.values()),
                retain_graph=True,
                allow_unused=True,
                is_grads_batched=True,
            )
        ]
        if not integrated:
            return grads
        assert self.held is not None and self.totals is not None
        along = path_gradients(
            self.model,
            self.prompt,
            self.sources,
            self.edit,
            self.held,
            self.totals,
            seeds,
            self._output,
            self.steps,
        )
        return grads + along[1:]
