"""A GGUF file written from a tiny Llama checkpoint, so the llama.cpp runner is tested in seconds.

Written with the `gguf` package (llama.cpp's own writer) the way llama.cpp's converter lays out a
Llama: its tensor names, its hyperparameter keys, its BPE vocabulary, and the query/key rows
permuted from transformers' rotate-half RoPE layout into llama.cpp's interleaved one. F32 keeps
the weights exactly the checkpoint's, so the two runners can be compared token for token; Q8_0
gives a second quantisation of the same repository for the naming rules.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

TYPES = {"F32": (0, None), "Q8_0": (7, "Q8_0")}  # file_type id, tensor quantisation


def permute_rope(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a q/k projection from rotate-half order to llama.cpp's interleaved pairs."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_llama_gguf(checkpoint: Path, target: Path, quant: str = "F32") -> Path:
    """Write `checkpoint` (a saved LlamaForCausalLM with its tokenizer) as a GGUF file at
    `target`."""
    import gguf
    from safetensors.torch import load_file

    config = json.loads((checkpoint / "config.json").read_text())
    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
    template = json.loads((checkpoint / "tokenizer_config.json").read_text()).get("chat_template")
    weights = {
        k: v.to(torch.float32).numpy()
        for k, v in load_file(str(checkpoint / "model.safetensors")).items()
    }
    file_type, tensor_quant = TYPES[quant]

    writer = gguf.GGUFWriter(str(target), "llama")
    writer.add_name(target.stem.split(".")[0])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(config["hidden_size"] // heads)
    writer.add_rope_freq_base(
        float(
            config.get("rope_theta") or config.get("rope_parameters", {}).get("rope_theta", 10000.0)
        )
    )
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(file_type)

    vocab = tokenizer["model"]["vocab"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = {added["content"] for added in tokenizer["added_tokens"] if added.get("special")}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in special else 1 for token in tokens])  # CONTROL, NORMAL
    merges = tokenizer["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_add_bos_token(True)
    if template:
        writer.add_chat_template(template)

    def add(name: str, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array, dtype=np.float32)
        if tensor_quant is None or array.ndim == 1:
            writer.add_tensor(name, array)
            return
        kind = gguf.GGMLQuantizationType[tensor_quant]
        writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)

    add("token_embd.weight", weights["model.embed_tokens.weight"])
    add("output_norm.weight", weights["model.norm.weight"])
    add("output.weight", weights.get("lm_head.weight", weights["model.embed_tokens.weight"]))
    for i in range(config["num_hidden_layers"]):
        src = f"model.layers.{i}."
        add(f"blk.{i}.attn_norm.weight", weights[src + "input_layernorm.weight"])
        add(f"blk.{i}.attn_q.weight", permute_rope(weights[src + "self_attn.q_proj.weight"], heads))
        add(
            f"blk.{i}.attn_k.weight",
            permute_rope(weights[src + "self_attn.k_proj.weight"], kv_heads),
        )
        add(f"blk.{i}.attn_v.weight", weights[src + "self_attn.v_proj.weight"])
        add(f"blk.{i}.attn_output.weight", weights[src + "self_attn.o_proj.weight"])
        add(f"blk.{i}.ffn_norm.weight", weights[src + "post_attention_layernorm.weight"])
        add(f"blk.{i}.ffn_gate.weight", weights[src + "mlp.gate_proj.weight"])
        add(f"blk.{i}.ffn_up.weight", weights[src + "mlp.up_proj.weight"])
        add(f"blk.{i}.ffn_down.weight", weights[src + "mlp.down_proj.weight"])

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
