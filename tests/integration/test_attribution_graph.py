"""Attribution graphs (issue 35) on the tiny Llama, in float64: the replacement pass reproduces
the served logits, and every edge checked equals a central finite difference of the same
linearised model (its patterns, norm scales and the sources' writes held at the prompt's values,
one node's write nudged) within 1e-4: residual SAEs (MLPs left non-linear: attribution
patching) and a transcoder on every block (the exact linear graph). Pruning keeps the target
and the tokens, and the ablation check on the served runner measures what the graph predicts."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from millm.interp.attribution.graph import EXACT, PATCHING, Budget, Target, Tracer
from millm.interp.attribution.replacement import FrozenPass, ReplacementModel, Source, plain_source
from millm.interp.attribution.verify import verify
from millm.interp.sae import SAEWeights, StandardSAE, TopKSAE
from tests.integration.engine_helpers import prompt_ids

TEXT = "The capital of France is"
STEP = 1e-4


def random_sae(width: int, seed: int, k: int | None = None, features: int = 64):
    generator = torch.Generator().manual_seed(seed)
    weights = SAEWeights(
        torch.randn(width, features, generator=generator) * 0.3,
        torch.randn(features, generator=generator) * 0.1,
        torch.randn(features, width, generator=generator) * 0.3,
        torch.randn(width, generator=generator) * 0.1,
    )
    return TopKSAE(weights, k) if k else StandardSAE(weights)


def sources_of(kind: str, lm) -> list[Source]:
    width, blocks = lm.config.hidden_size, lm.config.num_hidden_layers
    if kind == "resid":
        return [
            Source("a", random_sae(width, 1, k=8), 0, "resid"),
            Source("b", random_sae(width, 2), 1, "resid"),
        ]
    if kind.startswith("clt"):  # block i's features write into every block from i on
        generator = torch.Generator().manual_seed(98)
        sources = []
        for i in range(blocks):
            sae = random_sae(width, 20 + i)
            cross = torch.randn(sae.d_sae, blocks - i, width, generator=generator) * 0.3
            sae.W_dec, sae.cross = cross[:, 0].contiguous(), cross
            skip = (
                torch.randn(width, width, generator=generator) * 0.05
                if kind == "clt-skip"
                else None
            )
            sources.append(Source(f"c{i}", sae, i, "mlp", skip))
        return sources
    skips = [None] * blocks
    if kind == "mlp-skip":  # a skip connection beside each transcoder: a live linear path
        generator = torch.Generator().manual_seed(99)
        skips = [torch.randn(width, width, generator=generator) * 0.05 for _ in range(blocks)]
    return [Source(f"t{i}", random_sae(width, 10 + i), i, "mlp", skips[i]) for i in range(blocks)]


def traced(lm, kind: str, dtype=torch.float64):
    model = ReplacementModel(lm.runner.layout, dtype)
    sources = [plain_source(s, dtype) for s in sources_of(kind, lm)]
    tracer = Tracer(
        model, prompt_ids(lm, TEXT), sources, Target((5,), (1.0,)), Budget(1000, batch=16)
    )
    tracer.start()
    while tracer.expand():
        pass
    return model, tracer, tracer.finish()


def test_the_replacement_pass_without_sources_gives_the_served_logits(llama_lm):
    prompt = prompt_ids(llama_lm, TEXT)
    model = ReplacementModel(llama_lm.runner.layout, torch.float32)
    with torch.inference_mode(False), torch.enable_grad():
        logits = model.trace(prompt, 2, []).logits.detach()
    with torch.inference_mode():
        served = llama_lm.runner.prompt_logits([*prompt, 0], len(prompt))[-1]
    assert float((logits[0] - served).abs().max()) < 1e-4
    assert torch.equal(logits[0], logits[1])  # rows of one pass are the same


@pytest.mark.parametrize(
    "kind, method",
    [
        ("resid", PATCHING),
        ("mlp", EXACT),
        ("mlp-skip", EXACT),
        ("clt", EXACT),
        ("clt-skip", EXACT),
    ],
)
def test_edges_equal_finite_differences_of_the_linearised_model(llama_lm, kind, method):
    model, tracer, graph = traced(llama_lm, kind)
    assert graph.method == method
    # The budget covers every feature: the ones left out reach the target by no path.
    assert 0 < len(graph.features) <= graph.active_features
    prompt, sources = graph.prompt, tracer.sources
    held = FrozenPass()
    with torch.inference_mode(False):
        clean = model.trace(prompt, 1, sources, held=held)

    def value(trace, node: int) -> float:
        kind_, _, _ = graph.kind(node)
        if kind_ == "target":
            return float(graph.target.value(trace.logits[0].detach()))
        feature = graph.features[node]
        return float(trace.sources[feature.source].pre[0, feature.position, feature.index].detach())

    def write(node: int) -> tuple[int, dict[int, torch.Tensor]]:
        """(position, {injection point: the vector the node writes there})."""
        kind_, source, position = graph.kind(node)
        if kind_ == "feature":
            feature = graph.features[node]
            place = sources[feature.source]
            writes = feature.activation * place.sae.writes(torch.tensor([feature.index]))[0]
            # Sources are in block order, so block j's injection point is j + 1.
            return position, {feature.source + k + 1: v for k, v in enumerate(writes)}
        if kind_ == "error":
            return position, {source + 1: clean.sources[source].errors[position]}
        return position, {0: clean.embeddings[position]}

    def nudged(position: int, vectors: dict[int, torch.Tensor], sign: float) -> float:
        shifts = {}
        for point, vector in vectors.items():
            shifts[point] = torch.zeros(len(prompt), vector.shape[0], dtype=torch.float64)
            shifts[point][position] = sign * STEP * vector
        with torch.inference_mode(False):
            return model.trace(prompt, 1, sources, held=held.replaying(), shifts=shifts)

    rng = random.Random(0)
    size = graph.adjacency.shape[0]
    targets = [size - 1, *rng.sample(range(len(graph.features)), 6)]
    checked = 0
    for target in targets:
        inputs = [s for s in range(size - 1) if graph.adjacency[target, s] != 0]
        assert inputs, target
        for source in rng.sample(inputs, min(6, len(inputs))):
            position, vectors = write(source)
            up, down = nudged(position, vectors, 1.0), nudged(position, vectors, -1.0)
            difference = (value(up, target) - value(down, target)) / (2 * STEP)
            assert difference == pytest.approx(float(graph.adjacency[target, source]), abs=1e-4)
            checked += 1
    assert checked >= 20


def test_pruning_keeps_the_target_and_tokens_and_scores_the_error_share(llama_lm):
    _, _, graph = traced(llama_lm, "resid")
    kept = graph.pruned.nodes
    tokens = slice(len(graph.features) + 2 * graph.positions, None)
    assert bool(kept[tokens].all())
    assert 0 < int(kept[: len(graph.features)].sum()) < len(graph.features)
    assert 0.0 < graph.replacement_score < 1.0 and 0.0 < graph.completeness_score <= 1.0


def test_the_check_ablates_on_the_served_runner(llama_lm, tiny_dirs):
    """One residual SAE (after block 1): the check removes a·W_dec through a steering operation
    and reads the served target, which equals transformers' forward with the same write taken
    out by a hook; the graph's linear predictions track the measured changes."""
    model = ReplacementModel(llama_lm.runner.layout, torch.float32)
    sources = [plain_source(s, torch.float32) for s in sources_of("resid", llama_lm)[1:]]
    prompt = prompt_ids(llama_lm, TEXT)
    tracer = Tracer(model, prompt, sources, Target((5,), (1.0,)), Budget(1000, batch=16))
    tracer.start()
    while tracer.expand():
        pass
    graph = tracer.finish()
    top = torch.argsort(graph.pruned.influence[: len(graph.features)], descending=True)[:6]
    with torch.inference_mode():
        checked = verify(llama_lm, graph, [int(i) for i in top], None)
    assert checked.served_value == pytest.approx(graph.target_value, abs=1e-4)
    assert checked.correlation is not None and checked.correlation > 0.7 and checked.passed

    reference = AutoModelForCausalLM.from_pretrained(str(tiny_dirs["llama"]), dtype=torch.float32)
    first = checked.checks[0]
    feature = graph.features[first.node]
    removed = feature.activation * sources[0].sae.W_dec[feature.index]

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        hidden = hidden.clone()
        hidden[0, feature.position] -= removed
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    with torch.inference_mode():
        clean = reference(torch.tensor([prompt])).logits[0, -1]
        handle = reference.model.layers[1].register_forward_hook(hook)
        ablated = reference(torch.tensor([prompt])).logits[0, -1]
        handle.remove()
    want = float(graph.target.value(ablated.double()) - graph.target.value(clean.double()))
    assert first.measured == pytest.approx(want, abs=1e-4)
