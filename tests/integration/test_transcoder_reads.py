"""What a transcoder training reads: at each block, the MLP's input as the served model computes it
and, beside it, what the block's MLP adds to the residual there, equal to the transformers
module's own output (Gemma 2's post-MLP norm included)."""

from __future__ import annotations

import pytest
import torch

from millm.interp.attribution.replacement import ReplacementModel
from millm.lab.dictionaries.steps import mlp_read


@pytest.mark.parametrize(("which", "family"), [("llama_lm", "llama"), ("gemma2_lm", "gemma2")])
def test_a_rows_output_is_what_the_block_adds_to_the_residual(which, family, request, tiny_dirs):
    from transformers import AutoModelForCausalLM

    lm = request.getfixturevalue(which)  # served: the lean runner's layout of these weights
    plain = AutoModelForCausalLM.from_pretrained(tiny_dirs[family], torch_dtype=torch.float32)
    layers = plain.model.layers
    inputs: dict[int, torch.Tensor] = {}
    added: dict[int, torch.Tensor] = {}

    def keep(into: dict, block: int, value: torch.Tensor) -> None:
        into[block] = value[0].detach()

    hooks = []
    for block, layer in enumerate(layers):
        post = getattr(layer, "post_feedforward_layernorm", None)
        where = post if post is not None else layer.mlp  # what is added to the residual
        hooks.append(layer.mlp.register_forward_pre_hook(
            lambda _m, args, b=block: keep(inputs, b, args[0])))  # fmt: skip
        hooks.append(where.register_forward_hook(
            lambda _m, _a, out, b=block: keep(added, b, out)))  # fmt: skip
    ids = torch.tensor([[1, 17, 29, 5, 44, 81, 12, 9, 33]])
    with torch.inference_mode():
        plain(ids)
    for hook in hooks:
        hook.remove()
    model = ReplacementModel(lm.runner.layout, frozen=False)
    assert len(inputs) == len(added) == len(layers) > 1
    for block, x in inputs.items():
        read = mlp_read(model, block, lm.device)
        assert read.tag == f"dictionary-training:{block}"
        with torch.inference_mode():
            rows = read.encode(x)
        assert rows.shape == (len(x) - 1, 2 * x.shape[-1])  # the sink's position left out
        torch.testing.assert_close(rows[:, : x.shape[-1]], x[1:].float())
        torch.testing.assert_close(
            rows[:, x.shape[-1] :], added[block][1:].float(), rtol=1e-4, atol=1e-5
        )
