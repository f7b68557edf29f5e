"""What a graph is made of, checked before any pass: its feature sources, its target and its size.

Sources are a registered transcoder set's transcoders and attached SAEs (every attached SAE by
default, none by default beside a transcoder set); one per block, since a node's id names its
block; SAEs with a run-time input normalisation are refused, as the ablation check could not
remove one feature's write exactly. The target's tokens must each be one token of the
vocabulary. The size is estimated before anything runs: the float32 copy of the weights the pass
runs on (the model's and the sources', a cross-layer transcoder's whole decoder included), the
pass's activations (kept once for every backward pass), and per target of a batched
backward pass about one block's share of them (the vmapped backward holds one op's batch at a
time). A graph whose pass does not fit MAX_GRAPH_BYTES is refused; otherwise each backward pass
takes as many targets as fit, at most ROWS (the bench's 64-token demo graphs peaked at 650-830
MiB against an estimate of about 780).
"""

from __future__ import annotations

from millm.engine.loader import LoadedModel
from millm.errors import InvalidRequest
from millm.interp.attribution.graph import EXACT, Budget, Target, method_of
from millm.interp.attribution.replacement import Source
from millm.kernel.books.transcoders import TranscoderBook
from millm.lab.attribution.parts import AttributionParts
from millm.lab.attribution.protocol import AttributionRequest, AttributionTarget

MAX_FEATURE_NODES = 4096  # features expanded in one graph (each is a row of the adjacency)
MAX_GRAPH_BYTES = 8 * 2**30  # the pass's weights copy and its retained activations
ROWS = 32
FLOAT = 4


def source_size(source: Source) -> int:
    """How many numbers a source's tensors hold (the pass copies them)."""
    sae = source.sae
    extra = [t for t in (source.skip, sae.cross) if t is not None]
    return sae.W_enc.numel() + sae.W_dec.numel() + sum(t.numel() for t in extra)


def feature_sources(
    state: AttributionParts, body: AttributionRequest, lm: LoadedModel, sets: TranscoderBook
) -> list[Source]:
    """The transcoders and attached SAEs the graph's features come from (400 naming
    `transcoders`, `saes[i]` or `saes`); one source per block."""
    transcoders = (
        []
        if body.transcoders is None
        else sets.get(body.transcoders, "transcoders").sources(lm, "transcoders")
    )
    sources = sae_sources(state, body, lm, allow_none=bool(transcoders))
    taken = {s.layer for s in transcoders}
    for i, source in enumerate(sources):
        if source.layer in taken:
            raise InvalidRequest(
                f"SAE {source.name} reads after block {source.layer}, which a transcoder of the "
                "set replaces; a graph takes one source per block",
                param=f"saes[{i}]" if body.saes is not None else "saes",
            )
    return reached(transcoders + sources, "saes")


def reached(sources: list[Source], param: str) -> list[Source]:
    """The sources, once every block a cross-layer transcoder's features write into has its own
    MLP source (the pass puts those writes into that block's reconstruction); 400 otherwise."""
    replaced = {s.layer for s in sources if s.site == "mlp"}
    for source in (s for s in sources if s.sae.reach > 1):
        into = range(source.layer, source.layer + source.sae.reach)
        missing = sorted(set(into) - replaced)
        if missing:
            raise InvalidRequest(
                f"{source.name} is a block of a cross-layer transcoder writing into blocks "
                f"{into.start}..{into.stop - 1}; attach its blocks {missing} too",
                param=param,
            )
    return sources


def sae_sources(
    state: AttributionParts, body: AttributionRequest, lm: LoadedModel, allow_none: bool
) -> list[Source]:
    """The attached SAEs of the graph: the asked ones, or every one unless transcoders are given."""
    attached = dict(state.steering.attached)
    if body.saes is None and allow_none:
        return []
    names = body.saes if body.saes is not None else sorted(attached)
    if not names:
        raise InvalidRequest(
            f"no SAE is attached to {lm.name}: a graph's features come from attached SAEs (POST "
            f"/api/saes/{{id}}/attach)",
            param="saes",
            code="sae_not_attached",
        )
    sources: list[Source] = []
    layers: dict[int, str] = {}
    for i, name in enumerate(names):
        param = f"saes[{i}]" if body.saes is not None else "saes"
        found = attached.get(name)
        if found is None:
            raise InvalidRequest(
                f"SAE {name} is not attached to {lm.name}; attach it first (POST "
                f"/api/saes/{name}/attach)",
                param=param,
                code="sae_not_attached",
            )
        if found.sae.normalize_activations != "none":
            raise InvalidRequest(
                f"SAE {name} normalises its input at run time ({found.sae.normalize_activations}); "
                "a graph needs features whose writes are exactly a·W_dec",
                param=param,
            )
        if found.point in layers:
            raise InvalidRequest(
                f"SAEs {layers[found.point]} and {name} both write after block {found.point}; a "
                "graph takes one source per block",
                param=param,
            )
        layers[found.point] = name
        if found.transcoder:
            sources.append(Source(name, found.sae, found.layer, "mlp", found.sae.W_skip))
        else:
            sources.append(Source(name, found.sae, found.point, "resid"))
    return sources


def token_of(lm: LoadedModel, ref: int | str, param: str) -> int:
    """A token id from an id or a string that encodes to exactly one token (400 naming `param`)."""
    vocabulary = int(lm.config.vocab_size)
    if isinstance(ref, int):
        if ref >= vocabulary:
            raise InvalidRequest(
                f"{param} is token {ref}; {lm.name}'s vocabulary holds 0..{vocabulary - 1}",
                param=param,
            )
        return ref
    ids = lm.tokenizer.encode(ref, add_special_tokens=False)
    if len(ids) != 1:
        raise InvalidRequest(
            f"{param} {ref!r} encodes to {len(ids)} tokens ({ids}); give one token, or its id",
            param=param,
        )
    return int(ids[0])


def target_of(lm: LoadedModel, asked: AttributionTarget | None) -> Target | None:
    """The asked target (None: the model's own top token, found in the first step). Blocking:
    tokenizes."""
    if asked is None:
        return None
    token = token_of(lm, asked.token, "target.token")
    if asked.versus is None:
        return Target((token,), (1.0,))
    versus = token_of(lm, asked.versus, "target.versus")
    if versus == token:
        raise InvalidRequest(
            "target.versus is the same token as target.token", param="target.versus"
        )
    return Target((token, versus), (1.0, -1.0))


def budget_of(
    body: AttributionRequest, lm: LoadedModel, sources: list[Source], positions: int
) -> Budget:
    """The graph's budget, with as many targets per backward pass as fit (400 when the pass does
    not)."""
    if body.max_feature_nodes > MAX_FEATURE_NODES:
        raise InvalidRequest(
            f"max_feature_nodes is {body.max_feature_nodes}; the server's cap is "
            f"{MAX_FEATURE_NODES}",
            param="max_feature_nodes",
        )
    config = lm.config
    blocks = int(config.num_hidden_layers)
    if body.integrated_gradients and method_of(sources, blocks) == EXACT:
        raise InvalidRequest(
            "integrated_gradients applies to attribution patching; with a transcoder on every "
            "block the replacement model is linear between nodes and its edges are exact already",
            param="integrated_gradients",
        )
    width = int(config.hidden_size)
    inner = int(getattr(config, "intermediate_size", None) or 4 * width)
    heads = int(config.num_attention_heads)
    vocabulary = int(config.vocab_size)
    weights = FLOAT * (blocks * (4 * width * width + 3 * width * inner) + vocabulary * width)
    weights += FLOAT * sum(source_size(s) for s in sources)  # the sources' float32 copies
    per_row = FLOAT * (
        positions * blocks * (14 * width + 4 * inner + heads * positions)
        + positions * sum(s.sae.d_sae * 2 for s in sources)
        + 2 * vocabulary
    )
    per_target = max(per_row // blocks, 1)
    passes = 2 if body.integrated_gradients else 1  # a path's pass beside the graph's own
    rows = min(
        ROWS, body.max_feature_nodes, (MAX_GRAPH_BYTES - weights - passes * per_row) // per_target
    )
    if rows < 1:
        need = (weights + passes * per_row + per_target) / 2**30
        raise InvalidRequest(
            f"this graph needs about {need:.1f} GiB ({positions} positions on {lm.name}); the cap "
            f"is {MAX_GRAPH_BYTES / 2**30:.0f} GiB: give a shorter text",
            param="messages" if body.messages is not None else "text",
        )
    return Budget(body.max_feature_nodes, body.node_threshold, body.edge_threshold, int(rows))
