"""Transcoder sets in circuit-tracer's format (issue 35): each file encodes as circuit-tracer's
SingleLayerTranscoder does (x @ W_enc.T + b_enc through ReLU or JumpReLU, decoded a @ W_dec +
b_dec), Gemma Scope's npz files too, and what cannot be read is refused saying why."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from millm.interp.transcoder_files import TranscoderFileError
from millm.interp.transcoders import read_transcoder_set
from tests.support.tiny_transcoders import (
    CONFIG,
    build_gemma_scope_npz,
    build_transcoder_set,
)


@pytest.mark.parametrize("jumprelu", [True, False])
def test_each_layer_encodes_and_decodes_as_circuit_tracer(tmp_path, jumprelu):
    directory = build_transcoder_set(tmp_path / "set", jumprelu=jumprelu)
    found = read_transcoder_set(directory)
    assert sorted(found.layers) == [0, 1, 2] and found.d_model == 64 and found.d_transcoder == 48
    assert found.architecture == ("jumprelu" if jumprelu else "standard")
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3))
    for layer, transcoder in found.layers.items():
        raw = load_file(str(directory / f"layer_{layer}.safetensors"))
        pre = x @ raw["W_enc"].T + raw["b_enc"]
        want = torch.relu(pre)
        if jumprelu:
            want = want * (pre > raw["activation_function.threshold"])
        got = transcoder.encode(x)
        assert torch.allclose(got, want, atol=1e-6)
        assert torch.allclose(transcoder.decode(got), got @ raw["W_dec"] + raw["b_dec"], atol=1e-6)


def test_a_listed_gemma_scope_file_reads_with_its_threshold(tmp_path):
    path = build_gemma_scope_npz(tmp_path / "set" / "layer_0" / "params.npz")
    (tmp_path / "set" / "config.yaml").write_text(CONFIG + "transcoders:\n  - layer_0/params.npz\n")
    found = read_transcoder_set(tmp_path / "set")
    (only,) = found.layers.values()
    assert found.architecture == "jumprelu" and only.W_enc.shape == (64, 48)
    assert path.is_file()


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda d: (d / "config.yaml").unlink(), "no config.yaml"),
        (
            lambda d: (d / "config.yaml").write_text("model_kind: sparse_coder\n"),
            "model_kind is 'sparse_coder', not one of transcoder_set, cross_layer_transcoder",
        ),
        (  # a CLT's config beside a set's files: its W_enc_/W_dec_ files are missing
            lambda d: (d / "config.yaml").write_text(
                CONFIG.replace("transcoder_set", "cross_layer_transcoder")
            ),
            "holds no W_enc_",
        ),
        (
            lambda d: (d / "config.yaml").write_text(
                CONFIG.replace("mlp.hook_in", "hook_resid_pre")
            ),
            "feature_input_hook",
        ),
        (
            lambda d: (d / "config.yaml").write_text(
                CONFIG + "transcoders:\n  - hf://a/b/layer_0.safetensors\n"
            ),
            "hub files",
        ),
        (
            lambda d: (d / "config.yaml").write_text(
                CONFIG + "transcoders:\n  - ../outside.safetensors\n"
            ),
            "leaves the set's directory",
        ),
        (
            lambda d: save_file(
                {**load_file(str(d / "layer_1.safetensors")), "W_skip": torch.zeros(64, 63)},
                str(d / "layer_1.safetensors"),
            ),
            r"W_skip is \(64, 63\), expected \(64, 64\)",
        ),
        (
            lambda d: save_file(
                {
                    k: v
                    for k, v in load_file(str(d / "layer_2.safetensors")).items()
                    if k != "b_dec"
                },
                str(d / "layer_2.safetensors"),
            ),
            "lacks b_dec",
        ),
        (lambda d: (d / "layer_1.safetensors").unlink(), "lacks layer_1.safetensors"),
        (
            lambda d: (d / "layer_2.labels.json").write_text('{"48": "past the width"}'),
            "layer_2.labels.json: .*feature 48 is past",
        ),
    ],
)
def test_what_cannot_be_read_is_refused_saying_why(tmp_path, change, words):
    directory = build_transcoder_set(tmp_path / "set")
    change(directory)
    with pytest.raises(TranscoderFileError, match=words):
        read_transcoder_set(directory)


def test_labels_beside_a_transcoder_file_are_its_features_labels(tmp_path):
    directory = build_transcoder_set(tmp_path / "set", labels=True)
    (directory / "layer_2.labels.json").unlink()  # a block without labels has none
    found = read_transcoder_set(directory)
    assert found.labels[1][5]["label"] == "block 1 #5" and len(found.labels[0]) == 48
    assert found.labels[2] == {}


def test_a_skip_connection_is_kept_beside_its_transcoder(tmp_path):
    directory = build_transcoder_set(tmp_path / "set", skip=True)
    found = read_transcoder_set(directory)
    assert sorted(found.skips) == [0, 1, 2]
    stored = load_file(str(directory / "layer_1.safetensors"))["W_skip"]
    assert torch.equal(found.skips[1], stored)


def test_one_file_of_a_set_reads_as_an_sae_hooked_at_its_blocks_mlp(tmp_path):
    from millm.interp.formats import read_sae

    directory = build_transcoder_set(tmp_path / "set", labels=True)
    info, sae = read_sae(directory / "layer_2.safetensors")
    assert (info.format, info.hook_point, info.layer) == ("transcoder", "mlp", 2)
    assert info.hook_name == "blocks.2.mlp.hook_in" and info.has_labels
    assert torch.equal(sae.W_dec, read_transcoder_set(directory).layers[2].W_dec)
    # A listed Gemma Scope file two folders below its set's config takes its place in the list.
    path = build_gemma_scope_npz(tmp_path / "gs" / "layer_1" / "width_48" / "params.npz")
    build_gemma_scope_npz(tmp_path / "gs" / "layer_0" / "width_48" / "params.npz", seed=1)
    listed = "transcoders:\n  - layer_0/width_48/params.npz\n  - layer_1/width_48/params.npz\n"
    (tmp_path / "gs" / "config.yaml").write_text(CONFIG + listed)
    info, _ = read_sae(path)
    assert (info.format, info.layer, info.architecture) == ("transcoder", 1, "jumprelu")
    # Without a set's config above it, the same file is a Gemma Scope SAE of the residual.
    (tmp_path / "gs" / "config.yaml").unlink()
    assert read_sae(path)[0].format == "gemma_scope"


def test_a_cross_layer_transcoder_reads_as_circuit_tracer_writes_it(tmp_path):
    from tests.support.tiny_transcoders import build_clt

    directory = build_clt(tmp_path / "clt", seed=4)
    found = read_transcoder_set(directory)
    assert found.kind == "cross_layer_transcoder" and sorted(found.layers) == [0, 1, 2]
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3))
    for block, transcoder in found.layers.items():
        encoder = load_file(str(directory / f"W_enc_{block}.safetensors"))
        decoder = load_file(str(directory / f"W_dec_{block}.safetensors"))[f"W_dec_{block}"]
        pre = x @ encoder[f"W_enc_{block}"].T + encoder[f"b_enc_{block}"]
        want = torch.relu(pre) * (pre > encoder[f"threshold_{block}"])
        assert torch.allclose(transcoder.encode(x), want, atol=1e-6)
        assert found.cross[block].shape == (48, 3 - block, 64)
        assert torch.equal(found.cross[block], decoder)
        assert torch.equal(transcoder.W_dec, decoder[:, 0])  # its own block's write
    # One block's encoder file is an SAE of its own, its whole decoder kept.
    from millm.errors import SAEFormatError
    from millm.interp.formats import read_sae

    info, sae = read_sae(directory / "W_enc_1.safetensors")
    assert (info.format, info.hook_point, info.layer) == ("transcoder", "mlp", 1)
    assert torch.equal(sae.cross, found.cross[1]) and torch.equal(sae.W_dec, found.cross[1][:, 0])
    with pytest.raises(SAEFormatError, match="not one of .* encoder files"):
        read_sae(directory / "W_dec_1.safetensors")
    # A lost decoder file or a decoder of the wrong depth is named.
    (directory / "W_dec_2.safetensors").unlink()
    with pytest.raises(TranscoderFileError, match="2 decoder files"):
        read_transcoder_set(directory)
    save_file({"W_dec_2": torch.zeros(48, 2, 64)}, str(directory / "W_dec_2.safetensors"))
    with pytest.raises(
        TranscoderFileError, match=r"W_dec_2 is \(48, 2, 64\), expected \(48, 1, 64\)"
    ):
        read_transcoder_set(directory)


def test_a_gemma_scope_2_file_reads_as_circuit_tracers_loader_renames_it(tmp_path):
    from tests.support.tiny_transcoders import build_gemma_scope_2_file

    for block in range(2):
        build_gemma_scope_2_file(
            tmp_path / "gs2" / f"layer_{block}" / "params.safetensors", seed=block
        )
    listed = "".join(f"  - layer_{b}/params.safetensors\n" for b in range(2))
    (tmp_path / "gs2" / "config.yaml").write_text(CONFIG + "transcoders:\n" + listed)
    found = read_transcoder_set(tmp_path / "gs2")
    raw = load_file(str(tmp_path / "gs2" / "layer_1" / "params.safetensors"))
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    pre = x @ raw["w_enc"] + raw["b_enc"]
    want = torch.relu(pre) * (pre > raw["threshold"])
    assert torch.allclose(found.layers[1].encode(x), want, atol=1e-6)
    assert torch.equal(found.layers[1].W_dec, raw["w_dec"])
    # Gemma Scope 2 adds x @ affine_skip_connection; millm adds x @ W_skip.T: the same.
    assert torch.allclose(x @ found.skips[1].T, x @ raw["affine_skip_connection"], atol=1e-6)


def test_a_gemma_scope_2_clt_reads_as_circuit_tracers_loader_reads_it(tmp_path):
    from millm.interp.formats import read_sae
    from tests.support.tiny_transcoders import build_gemma_scope_2_clt

    directory = build_gemma_scope_2_clt(tmp_path / "gs2-clt", seed=3)
    found = read_transcoder_set(directory)
    assert found.kind == "cross_layer_transcoder" and sorted(found.layers) == [0, 1, 2]
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(4))
    for block in range(3):
        raw = load_file(str(directory / f"layer_{block}" / "params.safetensors"))
        pre = x @ raw["w_enc"] + raw["b_enc"]
        want = torch.relu(pre) * (pre > raw["threshold"])
        assert torch.allclose(found.layers[block].encode(x), want, atol=1e-6)
        # circuit-tracer keeps w_dec[:, block:] (the layers from this one on) ...
        assert torch.equal(found.cross[block], raw["w_dec"][:, block:])
        # ... and adds x @ affine_skip_connection to the block's output; millm x @ W_skip.T.
        assert torch.allclose(
            x @ found.skips[block].T, x @ raw["affine_skip_connection"], atol=1e-6
        )
    info, sae = read_sae(directory / "layer_1" / "params.safetensors")
    assert (info.format, info.layer) == ("transcoder", 1) and sae.cross.shape == (48, 2, 64)


def test_a_sae_lens_file_whose_config_is_no_transcoder_is_refused_naming_it(tmp_path):
    block = tmp_path / "layer_0"
    block.mkdir()
    save_file({"W_enc": torch.zeros(8, 16), "W_dec": torch.zeros(16, 8)},
              str(block / "sae_weights.safetensors"))  # fmt: skip
    (block / "cfg.json").write_text('{"architecture": "topk"}')
    (tmp_path / "config.yaml").write_text(
        "model_kind: transcoder_set\nfeature_input_hook: mlp.hook_in\n"
        "feature_output_hook: mlp.hook_out\ntranscoders:\n  - layer_0/sae_weights.safetensors\n"
    )
    with pytest.raises(
        TranscoderFileError, match="architecture 'topk' is not a SAELens transcoder"
    ):
        read_transcoder_set(tmp_path)
