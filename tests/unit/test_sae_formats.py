"""Reading SAE files: every supported variant, and a clear 400 naming every kind of malformed file."""

import json

import pytest
import torch

from millm.interp.formats import SAEFormatError, content_id, parse_hook_name, read_sae
from millm.interp.sae import JumpReLUSAE, StandardSAE, TopKSAE
from tests.support.tiny_saes import build_gemma_scope, build_saelens, sae_tensors


@pytest.mark.parametrize("architecture, cls", [("topk", TopKSAE), ("jumprelu", JumpReLUSAE), ("standard", StandardSAE), ("relu", StandardSAE)])
def test_saelens_architectures(tmp_path, architecture, cls):
    info, sae = read_sae(build_saelens(tmp_path / "sae", architecture=architecture, layer=2))
    assert isinstance(sae, cls)
    assert (info.format, info.d_in, info.d_sae, info.layer, info.hook_point) == ("saelens", 64, 128, 2, "resid_post")
    assert info.id == content_id(tmp_path / "sae" / "sae_weights.safetensors") and info.id.startswith("sae_")
    assert info.has_labels


def test_hook_points():
    assert parse_hook_name("blocks.12.hook_resid_post") == (12, "resid_post")
    assert parse_hook_name("blocks.0.hook_resid_pre") == (0, "resid_pre")
    for bad in ("blocks.3.hook_mlp_out", "blocks.3.attn.hook_z", "layer.3"):
        with pytest.raises(SAEFormatError, match="not supported"):
            parse_hook_name(bad)


def test_nested_metadata_and_activation_fn_kwargs(tmp_path):
    directory = build_saelens(tmp_path / "sae", architecture="topk", config={"hook_name": None, "k": None})
    cfg = json.loads((directory / "cfg.json").read_text())
    cfg.pop("hook_name"), cfg.pop("k")
    cfg["metadata"] = {"hook_name": "blocks.2.hook_resid_pre", "model_name": "m"}
    cfg["activation_fn_kwargs"] = {"k": 4}
    (directory / "cfg.json").write_text(json.dumps(cfg))
    info, sae = read_sae(directory)
    assert (info.layer, info.hook_point, info.k, sae.k) == (2, "resid_pre", 4, 4)


def test_older_hook_layer_and_log_threshold(tmp_path):
    tensors = sae_tensors(64, 128)
    tensors["log_threshold"] = torch.log(torch.full((128,), 0.25))
    directory = build_saelens(tmp_path / "sae", architecture="jumprelu", tensors=tensors, config={"hook_name": None, "hook_layer": 3})
    info, sae = read_sae(directory)
    assert info.layer == 3 and torch.allclose(sae.threshold, torch.full((128,), 0.25))


def test_expected_average_scaling_factor_is_folded(tmp_path):
    plain_info, plain = read_sae(build_saelens(tmp_path / "a", architecture="standard"))
    _, folded = read_sae(build_saelens(tmp_path / "b", architecture="standard", config={"normalize_activations": "expected_average_only_in", "norm_scaling_factor": 2.0}))
    assert torch.allclose(folded.W_enc, plain.W_enc * 2.0) and torch.allclose(folded.W_dec, plain.W_dec / 2.0)


def break_tensor(tmp_path, change):
    tensors = sae_tensors(64, 128)
    change(tensors)
    return build_saelens(tmp_path / "sae", architecture="standard", tensors=tensors)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.pop("W_dec"), "has no tensor 'W_dec'"),
        (lambda t: t.update(W_enc=t["W_enc"].T.contiguous()), "W_enc is transposed: expected [d_in, d_sae] = [64, 128], got [128, 64]"),
        (lambda t: t.update(W_dec=t["W_dec"].T.contiguous()), "W_dec is transposed"),
        (lambda t: t.update(b_dec=torch.zeros(63)), "b_dec has shape [63], expected [d_in] = [64]"),
        (lambda t: t.update(b_enc=torch.zeros(127)), "b_enc has shape [127]"),
    ],
)
def test_malformed_tensors(tmp_path, change, message):
    with pytest.raises(SAEFormatError) as info:
        read_sae(break_tensor(tmp_path, change))
    assert message in info.value.message
    assert info.value.status == 400


@pytest.mark.parametrize(
    "config, message",
    [
        ({"architecture": "gated"}, "architecture 'gated' is not supported"),
        ({"hook_name": "blocks.1.hook_mlp_out"}, "hook point 'blocks.1.hook_mlp_out' is not supported"),
        ({"d_in": "64"}, "d_in must be a positive integer"),
        ({"k": 0}, "needs k between 1 and d_sae"),
        ({"normalize_activations": "weird"}, "normalize_activations 'weird' is not supported"),
    ],
)
def test_malformed_configs(tmp_path, config, message):
    with pytest.raises(SAEFormatError, match=message.replace("(", r"\(").replace("[", r"\[")):
        read_sae(build_saelens(tmp_path / "sae", architecture="topk", config=config))


def test_jumprelu_without_threshold_is_refused(tmp_path):
    with pytest.raises(SAEFormatError, match="without a 'threshold'"):
        read_sae(build_saelens(tmp_path / "sae", architecture="jumprelu", tensors=sae_tensors(64, 128)))


def test_missing_files_and_bad_bytes(tmp_path):
    directory = build_saelens(tmp_path / "sae")
    (directory / "sae_weights.safetensors").write_bytes(b"garbage")
    with pytest.raises(SAEFormatError, match="not a readable safetensors file"):
        read_sae(directory)
    (directory / "cfg.json").write_text("{nope")
    with pytest.raises(SAEFormatError, match="not valid JSON"):
        read_sae(directory)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SAEFormatError, match="neither a SAELens SAE"):
        read_sae(tmp_path / "empty")


@pytest.mark.parametrize("lower_case", [False, True])
def test_gemma_scope_npz(tmp_path, lower_case):
    path = build_gemma_scope(tmp_path / "layer_5" / "width_16k" / "average_l0_40" / "params.npz", lower_case=lower_case)
    info, sae = read_sae(path)
    assert isinstance(sae, JumpReLUSAE) and not sae.apply_b_dec_to_input
    assert (info.format, info.layer, info.hook_name, info.d_in, info.d_sae) == ("gemma_scope", 5, "blocks.5.hook_resid_post", 64, 128)
    assert read_sae(path.parent)[0].id == info.id  # the folder holding params.npz works too


def test_gemma_scope_without_threshold(tmp_path):
    import numpy as np

    t = sae_tensors(64, 128)
    path = tmp_path / "layer_1" / "params.npz"
    path.parent.mkdir()
    np.savez(path, **{k: v.numpy() for k, v in t.items()})
    with pytest.raises(SAEFormatError, match="without a 'threshold'"):
        read_sae(path)


def test_same_file_same_id(tmp_path):
    a = read_sae(build_saelens(tmp_path / "a", seed=1))[0].id
    b = read_sae(build_saelens(tmp_path / "b", seed=1))[0].id
    c = read_sae(build_saelens(tmp_path / "c", seed=2))[0].id
    assert a == b != c
