"""Acceptance on the real demo model (SmolLM2-135M-Instruct from its Q4_1 GGUF), served as the
README does: on llama.cpp, the file kept quantised."""

import hashlib

import pytest

from millm.engine.loader import GGUF_META, gguf_cache_key
from millm.engine.loader_llamacpp import GGUF_META_ENTRIES
from millm.engine.sources import demo_source
from tests.api.clients import sdk

pytestmark = pytest.mark.acceptance
MODEL = "SmolLM2-135M-Instruct"
# "What is the capital of France?" gets "L'Étoile, la Marseillaise, ..." from llama.cpp: its top two
# first tokens are 0.3 apart and llama.cpp rounds activations to 8 bits (docs/engine.md).
FRANCE = [{"role": "user", "content": "Which city is the capital of France?"}]


def ask(server, messages=FRANCE, **kwargs):
    return sdk(server).chat.completions.create(
        model=MODEL, messages=messages, **{"temperature": 0, "max_tokens": 30, **kwargs}
    )


def test_capital_of_france(demo_server):
    response = ask(demo_server)
    assert "Paris" in response.choices[0].message.content
    assert response.choices[0].finish_reason == "stop"


def test_fingerprint_names_the_gguf_file_and_quantization(demo_server):
    source = demo_source()
    digest = hashlib.sha256((source.directory / source.gguf_file).read_bytes()).hexdigest()[:8]
    assert (
        ask(demo_server, max_tokens=1).system_fingerprint
        == f"millm:{MODEL}@{digest}:float32/Q4_1:llama.cpp"
    )


def test_the_files_metadata_is_cached_under_the_data_directory(demo_server):
    # The cache outlives a run (tests/support/model_cache.py): an earlier copy of the package's
    # file (another mtime) may still be there, within the kept count; this run's entry must be.
    cache = demo_server.log_path.parent / "cache" / "gguf-meta"
    cached = list(cache.glob(f"*/{GGUF_META}"))
    assert cache / gguf_cache_key(demo_source().gguf_path) / GGUF_META in cached
    assert len(cached) <= GGUF_META_ENTRIES


def test_stream_equals_whole_answer(demo_server):
    whole = ask(demo_server).choices[0].message.content
    streamed = "".join(
        c.choices[0].delta.content or "" for c in ask(demo_server, stream=True) if c.choices
    )
    assert streamed == whole


def test_stop_string_on_a_real_answer(demo_server):
    response = ask(demo_server, stop=["Paris"])
    assert response.choices[0].finish_reason == "stop"
    assert "Paris" not in response.choices[0].message.content
    assert response.choices[0].message.content.startswith("The capital of France is")


def test_continue_resumes_mid_sentence(demo_server):
    messages = FRANCE + [{"role": "assistant", "content": "The capital of France is"}]
    text = ask(demo_server, messages=messages, max_tokens=5).choices[0].message.content
    assert text.lstrip().startswith("Paris")
    assert "capital" not in text  # it continues; it does not start the answer again


def test_completion_on_raw_text(demo_server):
    response = sdk(demo_server).completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0
    )
    assert "Paris" in response.choices[0].text
