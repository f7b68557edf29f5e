"""Integrated gradients on an attribution-patching graph (issue 35's option), on the tiny Llama in
float64 with one residual SAE after block 1, its b_dec the residual's mean there (what a trained
SAE's b_dec learns). Completeness, the property that defines them: the edges from the SAE's nodes
(its features and error nodes) into the target sum to the target's change when they are all
removed, which transformers' own forward measures here with a hook (the residual after block 1
set to b_dec past the sink), up to the midpoint rule's error, which falls as 1/steps² (halved
from 32 steps to 64: a quarter; no other error is left); gradient × activation, the graph's
default, misses by far more. The tokens keep the pass's own gradient, so a feature's row (the
tokens are its only inputs here) is the default graph's."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from millm.interp.attribution.graph import INTEGRATED, PATCHING, Budget, Target, Tracer
from millm.interp.attribution.replacement import ReplacementModel, Source, plain_source
from tests.integration.engine_helpers import prompt_ids
from tests.integration.test_attribution_graph import TEXT, random_sae

TARGET = Target((5,), (1.0,))


@pytest.fixture(scope="module")
def reference(tiny_dirs):
    return AutoModelForCausalLM.from_pretrained(str(tiny_dirs["llama"]), dtype=torch.float64)


@pytest.fixture(scope="module")
def source(llama_lm, reference) -> Source:
    prompt = prompt_ids(llama_lm, TEXT)
    with torch.inference_mode():
        hidden = reference(torch.tensor([prompt]), output_hidden_states=True).hidden_states[2][0]
    sae = random_sae(llama_lm.config.hidden_size, 2)
    sae.b_dec = hidden[1:].mean(0).float()
    return plain_source(Source("b", sae, 1, "resid"), torch.float64)


def graph_of(lm, source: Source, steps: int):
    model = ReplacementModel(lm.runner.layout, torch.float64)
    prompt = prompt_ids(lm, TEXT)
    tracer = Tracer(model, prompt, [source], TARGET, Budget(1000, batch=64), steps=steps)
    tracer.start()
    while tracer.expand():
        pass
    return tracer.finish()


def removed(reference, prompt: list[int], b_dec: torch.Tensor) -> torch.Tensor:
    """The last position's logits with the residual after block 1 set to b_dec past the sink."""

    def hook(module, args, output):
        hidden = (output[0] if isinstance(output, tuple) else output).clone()
        hidden[0, 1:] = b_dec
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = reference.model.layers[1].register_forward_hook(hook)
    try:
        with torch.inference_mode():
            return reference(torch.tensor([prompt])).logits[0, -1]
    finally:
        handle.remove()


def test_edges_into_the_target_sum_to_removing_the_sae_nodes(llama_lm, reference, source):
    prompt = prompt_ids(llama_lm, TEXT)
    with torch.inference_mode():
        clean = reference(torch.tensor([prompt])).logits[0, -1]
    gone = removed(reference, prompt, source.sae.b_dec)
    want = float(TARGET.value(clean) - TARGET.value(gone))
    assert abs(want) > 0.1  # the SAE's nodes matter to the target

    graphs = {steps: graph_of(llama_lm, source, steps) for steps in (0, 4, 32, 64)}
    gaps = {}
    for steps, graph in graphs.items():
        assert graph.method == (INTEGRATED if steps else PATCHING)
        features, positions = len(graph.features), graph.positions
        row = graph.adjacency[-1]
        summed = float(row[:features].sum() + row[features : features + positions].sum())
        gaps[steps] = abs(summed - want)
    # Measured: gaps 1.53 (gradient x activation), 0.041, 5.3e-4, 1.3e-4 of a change of 2.81.
    assert gaps[32] < 1e-3 * abs(want)
    assert 3.5 < gaps[32] / gaps[64] < 4.5  # the midpoint rule's 1/steps², nothing else
    assert gaps[4] > 30 * gaps[32] and gaps[0] > 1000 * gaps[32]

    # The tokens keep the pass's gradient: a feature's inputs (tokens only) are the default's.
    plain, integrated = graphs[0], graphs[32]
    assert [f.index for f in plain.features] == [f.index for f in integrated.features]
    rows = slice(0, len(plain.features))
    assert torch.allclose(plain.adjacency[rows], integrated.adjacency[rows], atol=1e-9)
