"""Acceptance: the demo started with --engine llama.cpp answers sensibly, its profiles steer and
its SAE reads, inside llama.cpp's graph on the demo's own Q4_1 file; under a memory cap its window
is lowered to fit."""

from __future__ import annotations

import httpx
import pytest

from tests.api.clients import post, sdk
from tests.support.model_cache import start_sharing

pytestmark = pytest.mark.acceptance
MODEL = "SmolLM2-135M-Instruct"
WEEKEND = [{"role": "user", "content": "Tell me about your weekend."}]


@pytest.fixture(scope="module")
def cpp_demo(tmp_path_factory):
    # The demo's dequantised copy holds the file's tokenizer already converted (no 20 s GGUF read).
    # 300 MiB holds the file (94 MiB), a micro-batch of logits (96 MiB) and a 4,096-token float16
    # KV cache (90 MiB): 280 MiB; not the 8,192 tokens the model was trained for (180 MiB: 370 MiB).
    server = start_sharing(
        "demo",
        tmp_path_factory.mktemp("cpp-demo-home"),
        ["--engine", "llama.cpp"],
        env={"MILLM_MEMORY_LIMIT_BYTES": str(300 * 2**20)},
    )
    try:
        yield server
    finally:
        server.stop()


def answer(server, messages, **extra) -> str:
    response = sdk(server).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=60, temperature=0, extra_body=extra or None
    )
    assert response.system_fingerprint.endswith("/Q4_1:llama.cpp")
    return response.choices[0].message.content


def test_paris(cpp_demo):
    # "What is the capital of France?" itself gets "L'Étoile, la Marseillaise, ..." here: llama.cpp
    # rounds activations to 8 bits in its Q4_1 products, and the model's top two first tokens are
    # 0.3 apart (docs/engine.md, the llama.cpp engine). llama-cpp-python answers the same.
    assert "Paris" in answer(
        cpp_demo, [{"role": "user", "content": "Which city is the capital of France?"}]
    )


@pytest.mark.parametrize(
    "profile, words",
    [("pirate", ["pirate", "ship", "sea"]), ("france", ["French", "France", "Paris"])],
)
def test_demo_profiles_steer_on_llamacpp(cpp_demo, profile, words):
    plain = answer(cpp_demo, WEEKEND)
    steered = answer(cpp_demo, WEEKEND, profile=profile)
    assert steered != plain
    assert any(word in steered for word in words), steered
    assert not any(word in plain for word in words if word != "sea")


def test_the_demo_sae_reads_on_llamacpp(cpp_demo):
    body = {
        "model": MODEL,
        "messages": WEEKEND,
        "max_tokens": 8,
        "temperature": 0,
        "return_sae_activations": {"top_k": 3, "tokens": True},
    }
    response = post(cpp_demo, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    read = response.json()["millm"]["sae_activations"]
    assert read["layer"] == 12 and len(read["positions"]) == 7  # every token fed (the last is not)
    for position in read["positions"]:
        values = [f["value"] for f in position["features"]]
        assert len(values) == 3 and values == sorted(values, reverse=True) and values[-1] > 0
    assert httpx.get(f"{cpp_demo.base_url}/api/health/inference").json()["engine"] == "llama.cpp"


def test_the_window_was_lowered_to_fit_the_memory_cap(cpp_demo):
    card = httpx.get(f"{cpp_demo.base_url}/v1/models/{MODEL}").json()
    assert card["max_model_len"] == 4096
    assert (
        "its 8192-token window does not fit in memory beside the file; loading it with 4096 tokens"
        in cpp_demo.log
    )
