"""Reading SAE files: every supported variant, and a clear 400 naming every kind of malformed
file."""

import json

import pytest
import torch

from millm.interp.formats import SAEFormatError, read_labels, read_sae
from millm.interp.sae import JumpReLUSAE, StandardSAE, TopKSAE
from millm.interp.sae_files import content_id, parse_hook_name
from tests.support.tiny_saes import build_gemma_scope, build_saelens, sae_tensors


@pytest.mark.parametrize(
    "architecture, cls",
    [
        ("topk", TopKSAE),
        ("jumprelu", JumpReLUSAE),
        ("standard", StandardSAE),
        ("relu", StandardSAE),
    ],
)
def test_saelens_architectures(tmp_path, architecture, cls):
    info, sae = read_sae(build_saelens(tmp_path / "sae", architecture=architecture, layer=2))
    assert isinstance(sae, cls)
    assert (info.format, info.d_in, info.d_sae, info.layer, info.hook_point) == (
        "saelens",
        64,
        128,
        2,
        "resid_post",
    )
    assert info.id == content_id(
        tmp_path / "sae" / "sae_weights.safetensors"
    ) and info.id.startswith("sae_")
    assert info.has_labels


def test_hook_points():
    assert parse_hook_name("blocks.12.hook_resid_post") == (12, "resid_post")
    assert parse_hook_name("blocks.0.hook_resid_pre") == (0, "resid_pre")
    for bad in ("blocks.3.hook_mlp_out", "blocks.3.attn.hook_z", "layer.3"):
        with pytest.raises(SAEFormatError, match="not supported"):
            parse_hook_name(bad)


def test_nested_metadata_and_activation_fn_kwargs(tmp_path):
    directory = build_saelens(
        tmp_path / "sae", architecture="topk", config={"hook_name": None, "k": None}
    )
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
    directory = build_saelens(
        tmp_path / "sae",
        architecture="jumprelu",
        tensors=tensors,
        config={"hook_name": None, "hook_layer": 3},
    )
    info, sae = read_sae(directory)
    assert info.layer == 3 and torch.allclose(sae.threshold, torch.full((128,), 0.25))


def test_expected_average_scaling_factor_is_folded(tmp_path):
    _, plain = read_sae(build_saelens(tmp_path / "a", architecture="standard"))
    _, folded = read_sae(
        build_saelens(
            tmp_path / "b",
            architecture="standard",
            config={
                "normalize_activations": "expected_average_only_in",
                "norm_scaling_factor": 2.0,
            },
        )
    )
    assert torch.allclose(folded.W_enc, plain.W_enc * 2.0) and torch.allclose(
        folded.W_dec, plain.W_dec / 2.0
    )


def break_tensor(tmp_path, change):
    tensors = sae_tensors(64, 128)
    change(tensors)
    return build_saelens(tmp_path / "sae", architecture="standard", tensors=tensors)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.pop("W_dec"), "has no tensor 'W_dec'"),
        (
            lambda t: t.update(W_enc=t["W_enc"].T.contiguous()),
            "W_enc is transposed: expected [d_in, d_sae] = [64, 128], got [128, 64]",
        ),
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
        (
            {"architecture": "gated"},
            "cfg.json: architecture: Input should be 'standard', 'jumprelu' or 'topk' (got "
            "'gated')",
        ),
        (
            {"hook_name": "blocks.1.hook_mlp_out"},
            "hook point 'blocks.1.hook_mlp_out' is not supported",
        ),
        (
            {"hook_name": None, "metadata": {"hook_name": "blocks.1.hook_mlp_out"}},
            "hook point 'blocks.1.hook_mlp_out' is not supported",
        ),
        ({"hook_name": None}, "cfg.json names no hook_name (or hook_layer)"),
        ({"d_in": "64"}, "cfg.json: d_in: Input should be a valid integer (got '64')"),
        ({"d_sae": 0}, "cfg.json: d_sae: Input should be greater than 0 (got 0)"),
        (
            {"d_in": -1, "d_sae": True},
            "cfg.json: d_in: Input should be greater than 0 (got -1); d_sae: Input should be a "
            "valid integer (got True)",
        ),
        ({"k": 0}, "cfg.json: k: Input should be greater than 0 (got 0)"),
        ({"k": 500}, "cfg.json: k: a topk SAE needs k between 1 and d_sae (128), got 500"),
        ({"k": None}, "a topk SAE needs k between 1 and d_sae (128), got None"),
        (
            {"normalize_activations": "weird"},
            "cfg.json: normalize_activations: Input should be 'none', 'expected_average_only_in', "
            "'constant_norm_rescale' or 'layer_norm' (got 'weird')",
        ),
        (
            {"apply_b_dec_to_input": "maybe"},
            "cfg.json: apply_b_dec_to_input: Input should be a valid boolean, unable to interpret "
            "input (got 'maybe')",
        ),
    ],
)
def test_malformed_configs(tmp_path, config, message):
    with pytest.raises(SAEFormatError) as info:
        read_sae(build_saelens(tmp_path / "sae", architecture="topk", config=config))
    assert message in info.value.message
    assert (info.value.status, info.value.code) == (400, "invalid_sae")


def test_a_missing_key_is_named(tmp_path):
    directory = build_saelens(tmp_path / "sae")
    cfg = json.loads((directory / "cfg.json").read_text())
    del cfg["d_sae"]
    (directory / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEFormatError, match="^cfg.json: d_sae: Field required$"):
        read_sae(directory)


def test_real_saelens_configs_with_many_keys_are_accepted(tmp_path):
    # As SAELens 6 writes it: hook and model fields under metadata, keys millm does not use.
    v6 = {
        "architecture": "jumprelu",
        "d_in": 64,
        "d_sae": 128,
        "dtype": "float32",
        "device": "cuda",
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "reshape_activations": "none",
        "metadata": {
            "sae_lens_version": "6.39.0",
            "hook_name": "blocks.3.hook_resid_post",
            "model_name": "google/gemma-2-2b",
            "hook_head_index": None,
            "context_size": 1024,
            "seqpos_slice": [None],
            "prepend_bos": True,
            "model_from_pretrained_kwargs": {"center_writing_weights": False},
            "neuronpedia_id": "gemma-2-2b/3-res",
        },
    }
    # As early SAELens wrote it: hook_layer, a boolean normalize_activations, training settings.
    old = {
        "d_in": 64,
        "d_sae": 128,
        "hook_name": None,
        "hook_layer": 2,
        "normalize_activations": False,
        "lr": 4e-4,
        "l1_coefficient": 5,
        "activation_fn_kwargs": {},
    }
    tensors = sae_tensors(64, 128)
    tensors["threshold"] = torch.full((128,), 0.1)
    directory = build_saelens(
        tmp_path / "v6",
        architecture="jumprelu",
        tensors=tensors,
        config={**v6, "hook_name": None, "model_name": None},
    )
    info, _ = read_sae(directory)
    assert (info.layer, info.model_name, info.neuronpedia_id) == (
        3,
        "google/gemma-2-2b",
        "gemma-2-2b/3-res",
    )
    info, sae = read_sae(build_saelens(tmp_path / "old", architecture="ReLU", config=old))
    assert (info.architecture, info.layer, sae.normalize_activations) == ("standard", 2, "none")


def test_feature_labels_are_validated(tmp_path):
    directory = build_saelens(tmp_path / "sae")
    (directory / "feature_labels.json").write_text(json.dumps({"0": {"label": "zero"}, "1": "one"}))
    info, _ = read_sae(directory)
    assert read_labels(info) == {0: {"label": "zero"}, 1: {"label": "one"}}
    (directory / "feature_labels.json").write_text(json.dumps({"0": "zero", "first": "one"}))
    with pytest.raises(
        SAEFormatError,
        match="^feature_labels.json: first: Input should be a valid integer, unable to parse "
        "string as an integer",
    ):
        read_labels(info)
    (directory / "feature_labels.json").write_text("[")
    with pytest.raises(SAEFormatError, match="^feature_labels.json: Invalid JSON: "):
        read_labels(info)


def test_jumprelu_without_threshold_is_refused(tmp_path):
    with pytest.raises(SAEFormatError, match="without a 'threshold'"):
        read_sae(
            build_saelens(tmp_path / "sae", architecture="jumprelu", tensors=sae_tensors(64, 128))
        )


def test_missing_files_and_bad_bytes(tmp_path):
    directory = build_saelens(tmp_path / "sae")
    (directory / "sae_weights.safetensors").write_bytes(b"garbage")
    with pytest.raises(SAEFormatError, match="not a readable safetensors file"):
        read_sae(directory)
    (directory / "cfg.json").write_text("{nope")
    with pytest.raises(
        SAEFormatError, match="^cfg.json: Invalid JSON: key must be a string at line 1 column 2$"
    ):
        read_sae(directory)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SAEFormatError, match="holds no SAE millm knows"):
        read_sae(tmp_path / "empty")


@pytest.mark.parametrize("lower_case", [False, True])
def test_gemma_scope_npz(tmp_path, lower_case):
    path = build_gemma_scope(
        tmp_path / "layer_5" / "width_16k" / "average_l0_40" / "params.npz", lower_case=lower_case
    )
    info, sae = read_sae(path)
    assert isinstance(sae, JumpReLUSAE) and not sae.apply_b_dec_to_input
    assert (info.format, info.layer, info.hook_name, info.d_in, info.d_sae) == (
        "gemma_scope",
        5,
        "blocks.5.hook_resid_post",
        64,
        128,
    )
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
