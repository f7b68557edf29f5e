"""Which engine a model gets (--engine and memory), GGUF names (repo:QUANT) and what a bare
repository name means when several quantisations are registered; which file of a hub GGUF
repository a tag names; the window and memory a GGUF file gets on llama.cpp."""

import json
import re
import shutil

import pytest
import torch

from millm.engine.sources import QUANT_SUFFIX, pick_quant, resolve_source
from millm.errors import AmbiguousModelName, ModelSourceError
from millm.kernel.model.checkpoints import GGUFShape, inspect
from millm.kernel.model.engines import (
    LLAMACPP,
    MIN_CONTEXT,
    TRANSFORMERS,
    choose_engine,
    llamacpp_sizing,
)
from millm.kernel.model.registry import ModelRegistry
from millm.store.database import Store, database_url


@pytest.mark.parametrize(
    "stem, repo, quant",
    [
        ("SmolLM2-135M-Instruct.Q4_1", "SmolLM2-135M-Instruct", "Q4_1"),
        ("Meta-Llama-3.1-8B-Instruct-Q4_K_M", "Meta-Llama-3.1-8B-Instruct", "Q4_K_M"),
        ("gemma-3-270m-it-q4_k_m", "gemma-3-270m-it", "q4_k_m"),
        ("llama-2-7b.IQ4_XS", "llama-2-7b", "IQ4_XS"),
        ("model.BF16", "model", "BF16"),
    ],
)
def test_a_quantisation_tag_is_read_off_the_file_name(stem, repo, quant):
    match = QUANT_SUFFIX.fullmatch(stem)
    assert match is not None and (match["repo"], match["quant"]) == (repo, quant)


@pytest.mark.parametrize("stem", ["qwen2.5-1.5b-instruct", "phi-3", "Instruct"])
def test_a_name_without_a_tag_has_none(stem):
    assert QUANT_SUFFIX.fullmatch(stem) is None


def test_gguf_sources_are_named_repo_quant(tiny_gguf, tmp_path):
    assert resolve_source(str(tiny_gguf), tmp_path).name == "tiny-llama:F32"
    untagged = shutil.copy(tiny_gguf, tmp_path / "plain.gguf")
    # the file's own general.file_type
    assert resolve_source(str(untagged), tmp_path).name == "plain:F32"


def test_auto_runs_gguf_files_on_llamacpp_when_it_is_installed(tiny_gguf, tiny_dirs, tmp_path):
    gguf = resolve_source(str(tiny_gguf), tmp_path)
    checkpoint = resolve_source(str(tiny_dirs["llama"]), tmp_path)
    assert choose_engine("auto", gguf) == LLAMACPP  # the setup installs llama-cpp-python
    assert choose_engine("auto", gguf, installed=lambda: False) == TRANSFORMERS
    # Bound for a GPU: llama.cpp only where its build offloads to one, else the card runs torch.
    gpu = torch.device("cuda", 0)
    assert choose_engine("auto", gguf, gpu, offloads=lambda: False) == TRANSFORMERS
    assert choose_engine("auto", gguf, gpu, offloads=lambda: True) == LLAMACPP
    assert choose_engine("auto", gguf, torch.device("cpu"), offloads=lambda: False) == LLAMACPP
    assert choose_engine("auto", checkpoint) == TRANSFORMERS
    assert choose_engine("transformers", gguf) == TRANSFORMERS
    assert choose_engine("llama.cpp", gguf) == LLAMACPP
    with pytest.raises(ModelSourceError, match="runs .gguf files"):
        choose_engine("llama.cpp", checkpoint)


def test_a_bare_repository_name_means_its_one_quantisation(tiny_gguf, tmp_path):
    registry = ModelRegistry(Store(database_url(tmp_path, None)), tmp_path / "hub")
    q8 = tiny_gguf.parent / "tiny-llama.Q8_0.gguf"
    registry.register(str(tiny_gguf), None)
    assert registry.canonical("tiny-llama") == "tiny-llama:F32"
    assert registry.canonical("tiny-llama:F32") == "tiny-llama:F32"
    assert registry.canonical("other") == "other"  # unknown names stay themselves (a 404 later)
    registry.register(str(q8), None)
    with pytest.raises(AmbiguousModelName, match="F32, Q8_0") as refused:
        registry.canonical("tiny-llama")
    assert refused.value.status == 400 and refused.value.code == "AMBIGUOUS_MODEL_NAME"


@pytest.mark.parametrize(
    "files, quant, found",
    [
        (["README.md", "m.Q4_K_M.gguf", "m.Q8_0.gguf"], "Q4_K_M", "m.Q4_K_M.gguf"),
        (
            ["m-q4_k_m.gguf", "m-q8_0.gguf"],
            "Q4_K_M",
            "m-q4_k_m.gguf",
        ),  # tags are matched case-blind
        (["m.Q4_K_M.gguf"], "Q5_K_M", None),
        (["m.F16.gguf", "m.BF16.gguf"], "F16", "m.F16.gguf"),
    ],
)
def test_a_hub_repository_s_file_is_picked_by_its_tag(files, quant, found):
    assert pick_quant("acme/m-GGUF", files, quant) == found


@pytest.mark.parametrize(
    "files, message",
    [
        (["m.Q4_K_M-00001-of-00002.gguf", "m.Q4_K_M-00002-of-00002.gguf"], "split into 2 files"),
        (["a.Q4_K_M.gguf", "b.Q4_K_M.gguf"], "several files (a.Q4_K_M.gguf, b.Q4_K_M.gguf)"),
    ],
)
def test_a_tag_that_names_no_single_file_is_refused_saying_why(files, message):
    with pytest.raises(ModelSourceError, match=re.escape(message)):
        pick_quant("acme/m-GGUF", files, "Q4_K_M")


GIB = 2**30
# A Llama-3.1-8B Q4_K_M: 32 layers x 8 KV heads x (128 + 128) key and value elements per token.
LLAMA_8B = GGUFShape(context_length=131072, kv_elements_per_token=32 * 8 * 256, vocab_size=128256)
FILE_8B = 4_920_739_232


def test_a_window_whose_kv_cache_does_not_fit_is_halved_until_it_does():
    sizing = llamacpp_sizing(FILE_8B, LLAMA_8B, None, False, lambda n: n <= 12 * GIB)
    # 131072 tokens: 16 GiB of float16 keys and values; 65536: 8 GiB; 32768: 4 GiB, beside a 4.6 GiB
    # file.
    assert (sizing.context, sizing.lowered_from) == (32768, 131072)
    assert sizing.needed == FILE_8B + 32768 * 32 * 8 * 256 * 2 + 512 * 128256 * 4
    assert sizing.describe() == "its file and a 32768-token KV cache"


def test_a_window_that_fits_or_was_asked_for_is_kept():
    assert llamacpp_sizing(FILE_8B, LLAMA_8B, None, False, lambda n: True).context == 131072
    # asked: kept, and checked as asked
    asked = llamacpp_sizing(FILE_8B, LLAMA_8B, 8192, True, lambda n: False)
    assert (asked.context, asked.lowered_from, asked.needed) == (
        8192,
        None,
        FILE_8B + 8192 * 65536 * 4 + 512 * 128256 * 4,
    )


def test_a_window_is_never_lowered_below_4096_tokens():
    sizing = llamacpp_sizing(FILE_8B, LLAMA_8B, None, False, lambda n: False)
    assert (sizing.context, sizing.lowered_from) == (MIN_CONTEXT, 131072) == (4096, 131072)


def test_the_tiny_gguf_s_shape_is_read_from_its_metadata(tiny_gguf, tiny_dirs):
    config = json.loads((tiny_dirs["llama"] / "config.json").read_text())
    shape = inspect(resolve_source(str(tiny_gguf), tiny_gguf.parent)).gguf
    head = config["hidden_size"] // config["num_attention_heads"]
    assert (
        shape.kv_elements_per_token
        == config["num_hidden_layers"] * config["num_key_value_heads"] * 2 * head
    )
    assert (shape.context_length, shape.vocab_size) == (
        config["max_position_embeddings"],
        config["vocab_size"],
    )
