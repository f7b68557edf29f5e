"""The published families' own layouts (Gemma Scope 2, Llama Scope, sparsify) read as their own code
reads them: activations asserted as numbers against SAELens's loader or the family's formula."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from millm.errors import SAEFormatError
from millm.interp.formats import read_sae
from tests.support.hub_cache import put
from tests.support.tiny_saes import (
    build_gemma_scope,
    build_gemma_scope_2,
    build_llama_scope,
    build_sparsify,
)

X = torch.randn(5, 64, generator=torch.Generator().manual_seed(7)) * 3


def test_gemma_scope_2_reads_its_residual_sae(tmp_path):
    folder = build_gemma_scope_2(
        tmp_path / "resid_post" / "layer_3_width_16k_l0_big", hook="model.layers.3.output"
    )
    info, sae = read_sae(folder)
    assert (info.format, info.layer, info.hook_point, info.d_sae) == (
        "gemma_scope_2",
        3,
        "resid_post",
        128,
    )
    assert info.model_name == "gemma-v3-270m-pt"
    raw = load_file(str(folder / "params.safetensors"))
    pre = X @ raw["w_enc"] + raw["b_enc"]  # no b_dec on the way in
    expected = torch.relu(pre) * (pre > raw["threshold"])
    assert torch.allclose(sae.encode(X), expected, atol=1e-5)
    assert (expected > 0).any()


def test_gemma_scope_2_layer_from_the_folder_without_config(tmp_path):
    info, _ = read_sae(build_gemma_scope_2(tmp_path / "resid_post" / "layer_5_width_16k_l0_small"))
    assert info.layer == 5 and info.hook_name == "blocks.5.hook_resid_post"


@pytest.mark.parametrize(
    ("folder", "hook"),
    [
        ("attn_out/layer_3_width_16k_l0_big", "model.layers.3.self_attn.o_proj.input"),
        ("mlp_out/layer_3_width_16k_l0_big", None),
        ("transcoder/layer_3_width_16k_l0_big", None),
    ],
)
def test_gemma_scope_2_refuses_what_is_not_the_residual(tmp_path, folder, hook):
    with pytest.raises(SAEFormatError, match="millm steers and reads the residual stream"):
        read_sae(build_gemma_scope_2(tmp_path / folder, hook=hook))


def test_gemma_scope_of_an_mlp_repository_is_refused(tmp_path):
    repo = tmp_path / "models--google--gemma-scope-2b-pt-mlp" / "snapshots" / "abc"
    path = build_gemma_scope(repo / "layer_2" / "width_16k" / "average_l0_50" / "params.npz")
    with pytest.raises(SAEFormatError, match="an MLP output"):
        read_sae(path)
    res = tmp_path / "models--google--gemma-scope-2b-pt-res" / "snapshots" / "abc"
    info, _ = read_sae(
        build_gemma_scope(res / "layer_2" / "width_16k" / "average_l0_50" / "params.npz")
    )
    assert info.layer == 2


def test_sparsify_matches_its_own_formula(tmp_path):
    folder = build_sparsify(tmp_path / "layers.2", k=6)
    info, sae = read_sae(folder)
    assert (info.format, info.layer, info.architecture, info.k) == ("sparsify", 2, "topk", 6)
    raw = load_file(str(folder / "sae.safetensors"))
    # sparsify: ReLU(encoder(x - b_dec)), the k largest kept; decode: acts @ W_dec + b_dec
    pre = torch.relu((X - raw["b_dec"]) @ raw["encoder.weight"].T + raw["encoder.bias"])
    top = pre.topk(6, dim=-1)
    expected = torch.zeros_like(pre).scatter(-1, top.indices, top.values)
    acts = sae.encode(X)
    assert torch.allclose(acts, expected, atol=1e-5)
    assert torch.allclose(sae.decode(acts), expected @ raw["W_dec"] + raw["b_dec"], atol=1e-4)


@pytest.mark.parametrize(
    ("config", "why"),
    [({"transcode": True}, "a transcoder"), ({"activation": "groupmax"}, "groupmax")],
)
def test_sparsify_refusals(tmp_path, config, why):
    with pytest.raises(SAEFormatError, match=why):
        read_sae(build_sparsify(tmp_path / "layers.1", **config))


def test_sparsify_folder_must_name_its_layer(tmp_path):
    with pytest.raises(SAEFormatError, match="layers.N"):
        read_sae(build_sparsify(tmp_path / "embed_tokens"))


def test_llama_scope_refuses_an_mlp_sae(tmp_path):
    with pytest.raises(SAEFormatError, match="hook point"):
        read_sae(build_llama_scope(tmp_path / "L1M", site="mlp_out"))


# SAELens's own loader, run offline on the same files (registry release llama_scope_lxr_8x, SAE
# l0r_8x, whose registry norm factor is 58.935...: the fixture's average norm makes the file's
# factor the same).
SAELENS_ENCODE = """
import json, sys, torch
from sae_lens import SAE
sae = SAE.from_pretrained("llama_scope_lxr_8x", "l0r_8x", device="cpu")
x = torch.tensor(json.loads(sys.stdin.read()))
print(json.dumps(sae.encode(x.to(sae.W_enc.dtype)).float().tolist()))
"""


def test_llama_scope_matches_saelens(tmp_path):
    pytest.importorskip("sae_lens")
    factor = 58.935251798561154
    folder = build_llama_scope(
        tmp_path / "Llama3_1-8B-Base-L0R-8x",
        layer=0,
        average_norm=math.sqrt(64) / factor,
        threshold=0.002,
    )
    info, sae = read_sae(folder)
    assert (info.format, info.layer, info.architecture) == ("llama_scope", 0, "jumprelu")
    cache = tmp_path / "hf"
    put(cache, "fnlp/Llama3_1-8B-Base-LXR-8x", "Llama3_1-8B-Base-L0R-8x", folder)
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    x = X / 40  # residuals of the scale the fixture's norm factor expects
    done = subprocess.run(
        [sys.executable, "-c", SAELENS_ENCODE],
        input=json.dumps(x.tolist()),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = torch.tensor(json.loads(done.stdout.strip().splitlines()[-1]))
    ours = sae.encode(x)
    assert (theirs > 0).sum() > 10  # some features fire, some do not
    assert (theirs == 0).sum() > 10
    # The same features fire with the same values (the fixture's weights are exact in bf16, the
    # dtype SAELens reads Llama Scope in, and both then compute in float32).
    assert torch.equal(ours > 0, theirs > 0)
    assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-5)
