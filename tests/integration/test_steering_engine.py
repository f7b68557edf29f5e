"""Steering inside the engine: the residual delta after the hook is exactly Σ s_i · W_dec[i]."""

import pytest
import torch

from millm.engine.residual import decoder_layers
from millm.interp.formats import read_sae
from millm.interp.steering import Attached, steering_edit
from tests.integration.engine_helpers import generate, prompt_ids, row
from tests.support.tiny_saes import build_saelens


def attach(tmp_path, name, layer, hook_point="resid_post", seed=0, architecture="topk"):
    info, sae = read_sae(
        build_saelens(
            tmp_path / name,
            layer=layer,
            hook_point=hook_point,
            seed=seed,
            architecture=architecture,
        )
    )
    return Attached(info, sae, layer)


def capture(lm, points):
    """Record each decoder block's output (after every earlier hook, i.e. after steering)."""
    seen, handles = {}, []
    layers = decoder_layers(lm.model)
    for point in points:

        def hook(module, args, output, point=point):
            seen[point] = (output[0] if isinstance(output, tuple) else output).detach().clone()

        handles.append(layers[point].register_forward_hook(hook))
    return seen, handles


def residuals(lm, prompt, edit, points):
    """Block outputs at `points` during a prefill steered by `edit`."""
    with torch.inference_mode():
        lm.residual.set_rows([edit])  # installs the steering hooks before the capture hooks
        seen, handles = capture(lm, points)
        try:
            lm.runner.prefill([prompt], capacity=len(prompt) + 1)
        finally:
            for handle in handles:
                handle.remove()
            lm.residual.clear()
    return seen


@pytest.mark.parametrize("model", ["llama_lm", "gemma2_lm"])
def test_delta_after_the_hook_is_the_weighted_decoder_sum(model, request, tmp_path):
    lm = request.getfixturevalue(model)
    a, b = attach(tmp_path, "a", layer=0, seed=1), attach(tmp_path, "b", layer=2, seed=2)
    strengths = {a.info.id: {3: 4.0, 9: -2.5}, b.info.id: {7: 6.0}}
    edit = steering_edit(strengths, {a.info.id: a, b.info.id: b})
    prompt = prompt_ids(lm, "The cat runs")
    plain = residuals(lm, prompt, None, [0, 2])
    steered = residuals(lm, prompt, edit, [0, 2])
    expected_a = 4.0 * a.sae.W_dec[3] - 2.5 * a.sae.W_dec[9]
    # At layer 0 the only difference is the added delta, at every position.
    assert torch.allclose(steered[0] - plain[0], expected_a.expand_as(plain[0]), atol=1e-5)
    # Layer 2's output = its (changed) input's result + b's delta: compare against an edit with only
    # a.
    only_a = residuals(
        lm, prompt, steering_edit({a.info.id: strengths[a.info.id]}, {a.info.id: a}), [2]
    )
    assert torch.allclose(
        steered[2] - only_a[2], (6.0 * b.sae.W_dec[7]).expand_as(plain[2]), atol=1e-5
    )


def test_resid_pre_steers_the_previous_block_output(llama_lm, tmp_path):
    pre2 = attach(tmp_path, "pre", layer=2, hook_point="resid_pre")
    edit = steering_edit({pre2.info.id: {5: 3.0}}, {pre2.info.id: pre2})
    prompt = prompt_ids(llama_lm, "A river")
    delta = residuals(llama_lm, prompt, edit, [1])[1] - residuals(llama_lm, prompt, None, [1])[1]
    assert torch.allclose(delta, (3.0 * pre2.sae.W_dec[5]).expand_as(delta), atol=1e-5)


def test_resid_pre_of_layer_zero_steers_the_embeddings(llama_lm, tmp_path):
    pre0 = attach(tmp_path, "pre0", layer=0, hook_point="resid_pre")
    edit = steering_edit({pre0.info.id: {5: 3.0}}, {pre0.info.id: pre0})
    prompt = prompt_ids(llama_lm, "A river")
    captured = {}
    embed = llama_lm.model.model.embed_tokens
    with torch.inference_mode():
        llama_lm.residual.set_rows([edit])  # installs the steering pre-hook first
        handle = decoder_layers(llama_lm.model)[0].register_forward_pre_hook(
            lambda m, args: captured.setdefault("x", args[0].clone())
        )
        try:
            llama_lm.runner.prefill([prompt], capacity=len(prompt) + 1)
        finally:
            handle.remove()
            llama_lm.residual.clear()
        plain = embed(torch.tensor([prompt]))
    assert torch.allclose(
        captured["x"] - plain, (3.0 * pre0.sae.W_dec[5]).expand_as(plain), atol=1e-5
    )


def test_steering_changes_greedy_text_and_zero_strength_does_not(llama_lm, tmp_path):
    target = attach(tmp_path, "s", layer=1)
    prompt = prompt_ids(llama_lm, "Every feature reads")
    plain = generate(llama_lm, [row(prompt, 20)]).texts[0]
    strong = steering_edit({target.info.id: {0: 40.0, 1: 40.0}}, {target.info.id: target})
    zero = steering_edit({target.info.id: {0: 0.0}}, {target.info.id: target})
    assert zero is None  # nothing to add
    assert generate(llama_lm, [row(prompt, 20, edit=strong)]).texts[0] != plain
    assert generate(llama_lm, [row(prompt, 20, edit=None)]).texts[0] == plain


def test_steered_and_unsteered_rows_share_a_batch(llama_lm, tmp_path):
    target = attach(tmp_path, "s", layer=1)
    edit = steering_edit({target.info.id: {0: 40.0}}, {target.info.id: target})
    prompt = prompt_ids(llama_lm, "Every feature reads")
    both = generate(llama_lm, [row(prompt, 15, edit=edit), row(prompt, 15)])
    assert both.texts[1] == generate(llama_lm, [row(prompt, 15)]).texts[0]
    assert both.texts[0] == generate(llama_lm, [row(prompt, 15, edit=edit)]).texts[0]
    assert both.texts[0] != both.texts[1]


def test_strengths_are_clamped_to_200(llama_lm, tmp_path):
    target = attach(tmp_path, "s", layer=1)
    edit = steering_edit({target.info.id: {0: 1000.0}}, {target.info.id: target})
    assert torch.allclose(edit.vector(1), 200.0 * target.sae.W_dec[0])
