"""Runners against a stock transformers model: same logits, hooks still work, kernels chosen
right."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from millm.engine.kernels import prepack_supported
from millm.engine.kv_cache import KVBuffer
from millm.engine.runner_hf import HFRunner
from millm.engine.runner_lean import LeanRunner
from millm.engine.runners import make_runner
from tests.integration.engine_helpers import prompt_ids
from tests.support import tiny_models


def stock(lm, dtype=torch.float32):
    return AutoModelForCausalLM.from_pretrained(str(lm.source.directory), dtype=dtype).eval()


def stock_last_logits(model, prompt):
    with torch.inference_mode():
        return model(torch.tensor([prompt])).logits[0, -1].float()


def test_runner_choice(llama_lm, gemma2_lm, tiny_dirs, tmp_path):
    assert isinstance(llama_lm.runner, LeanRunner) and llama_lm.runner.kernels == "prepacked x12"
    assert llama_lm.runner.name == "lean (llama)" and gemma2_lm.runner.name == "lean (gemma2)"
    phi3 = AutoModelForCausalLM.from_pretrained(
        str(tiny_models.build_phi3(tmp_path / "phi3", tiny_dirs["tokenizer"])), dtype=torch.float32
    )
    assert isinstance(make_runner(phi3, torch.device("cpu"), torch.float32), HFRunner)


@pytest.mark.parametrize("model", ["llama_lm", "gemma2_lm"])
def test_prefill_of_padded_rows_equals_stock_logits(model, request):
    lm = request.getfixturevalue(model)
    reference = stock(lm)
    prompts = [
        prompt_ids(lm, "Hello"),
        prompt_ids(lm, "My friend answers the city of France quickly"),
    ]
    with torch.inference_mode():
        _, logits = lm.runner.prefill(prompts, capacity=64)
    for row, prompt in enumerate(prompts):
        assert torch.allclose(logits[row], stock_last_logits(reference, prompt), atol=1e-4), row


def test_steering_hook_on_a_layer_sees_and_changes_its_output(llama_lm):
    """A forward hook adding a [B, 1, d] delta (zeros for unsteered rows), as steering will."""
    prompt = prompt_ids(llama_lm, "The cat runs")
    delta = torch.zeros(2, 1, llama_lm.model.config.hidden_size)
    delta[0, 0, :8] = 3.0

    def add_delta(module, args, output):
        return output + delta[: output.shape[0]]

    reference = stock(llama_lm)
    with torch.inference_mode():
        _, plain = llama_lm.runner.prefill([prompt], capacity=16)
        handles = [
            m.model.layers[1].register_forward_hook(add_delta) for m in (llama_lm.model, reference)
        ]
        try:
            _, steered = llama_lm.runner.prefill([prompt, prompt], capacity=16)
            reference_steered = reference(torch.tensor([prompt])).logits[0, -1]
        finally:
            for handle in handles:
                handle.remove()
    assert torch.equal(steered[1], plain[0])  # a zero delta leaves the row bit-identical
    assert not torch.allclose(steered[0], plain[0], atol=1e-3)
    assert torch.allclose(steered[0], reference_steered, atol=1e-4)


def q4_1_checkpoint(source_dir, target_dir):
    """The tiny Llama with every decoder linear rounded to Q4_1 (blocks of 32), as a GGUF file
    would hold it."""
    model = AutoModelForCausalLM.from_pretrained(str(source_dir), dtype=torch.float32)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and "layers" in name:
                w = module.weight.reshape(module.out_features, -1, 32)
                low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
                scale = (high - low) / 15
                module.weight.copy_(
                    (low + scale * torch.round((w - low) / scale)).reshape_as(module.weight)
                )
    model.save_pretrained(str(target_dir))
    return target_dir


def test_int4_runner_on_q4_1_weights(tiny_dirs, tmp_path):
    directory = q4_1_checkpoint(tiny_dirs["llama"], tmp_path / "q4")
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    reference = stock_last_logits(
        AutoModelForCausalLM.from_pretrained(str(directory)).eval(), [1, 40, 50, 60]
    )
    with torch.inference_mode():
        runner = make_runner(model, torch.device("cpu"), torch.bfloat16, q4_weights=True)
        _, logits = runner.prefill([[1, 40, 50, 60]], capacity=8)
    # 3 layers x (qkv, o, gate|up, down), each with a pre-packed copy for long prefills: bf16
    # where oneDNN pre-packs it (AVX-512, AVX-NE-CONVERT), float32 on other CPUs.
    copy = "bf16" if prepack_supported(torch.bfloat16) else "fp32"
    assert runner.kernels == f"int4 x12 ({copy} copy x12)"
    assert logits.dtype == torch.float32  # the float32 output layer
    assert torch.nn.functional.cosine_similarity(logits[0], reference, dim=0) > 0.999


def test_bfloat16_runner_keeps_a_float32_head(tiny_dirs):
    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_dirs["llama"]), dtype=torch.float32
    ).eval()
    reference = stock_last_logits(
        AutoModelForCausalLM.from_pretrained(str(tiny_dirs["llama"])).eval(), [1, 40, 50]
    )
    with torch.inference_mode():
        runner = make_runner(model, torch.device("cpu"), torch.bfloat16)
        _, logits = runner.prefill([[1, 40, 50]], capacity=8)
    assert next(model.model.layers[0].input_layernorm.parameters()).dtype == torch.bfloat16
    assert torch.nn.functional.cosine_similarity(logits[0], reference, dim=0) > 0.999


def test_kv_buffer_refuses_to_overflow():
    buffer = KVBuffer(
        layers=1, rows=1, kv_heads=1, capacity=2, head_dim=4, dtype=torch.float32, device="cpu"
    )
    buffer.update(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), 0)
    with pytest.raises(RuntimeError, match="overflow"):
        buffer.update(torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), 0)
