"""Which engine a model gets (--engine and memory), GGUF names (repo:QUANT) and what a bare
repository name means when several quantisations are registered; which file of a hub GGUF
repository a tag names."""

import re
import shutil

import pytest

from millm.engine.sources import QUANT_SUFFIX, pick_quant, resolve_source
from millm.errors import AmbiguousModelName, ModelSourceError
from millm.service.engines import LLAMACPP, TRANSFORMERS, choose_engine
from millm.service.models import ModelRegistry
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
    assert resolve_source(str(untagged), tmp_path).name == "plain:F32"  # the file's own general.file_type


def test_auto_keeps_transformers_while_the_weights_fit(tiny_gguf, tiny_dirs, tmp_path):
    gguf = resolve_source(str(tiny_gguf), tmp_path)
    checkpoint = resolve_source(str(tiny_dirs["llama"]), tmp_path)
    assert choose_engine("auto", gguf, lambda n: True, 10) == TRANSFORMERS
    assert choose_engine("auto", gguf, lambda n: n < 10, 10) == LLAMACPP  # the setup installs llama-cpp-python
    assert choose_engine("auto", checkpoint, lambda n: False, 10) == TRANSFORMERS
    assert choose_engine("transformers", gguf, lambda n: False, 10) == TRANSFORMERS
    assert choose_engine("llama.cpp", gguf, lambda n: True, 10) == LLAMACPP
    with pytest.raises(ModelSourceError, match="runs .gguf files"):
        choose_engine("llama.cpp", checkpoint, lambda n: True, 10)


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
        (["m-q4_k_m.gguf", "m-q8_0.gguf"], "Q4_K_M", "m-q4_k_m.gguf"),  # tags are matched case-blind
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
