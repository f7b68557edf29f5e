"""Acceptance: Gemma 3 270M's Q4_K_M file on llama.cpp (sliding-window layers, scaled embeddings,
its own norms) reads and steers through its shipped SAE inside llama.cpp's graph, as it does on
the transformers engine (tests/acceptance/test_gemma3_model.py asserts the same there)."""

from __future__ import annotations

import pytest

from tests.acceptance.test_gemma3_model import (
    DENSE,
    LAYER,
    MODEL,
    READING,
    SAE_ID,
    STRENGTH,
    WEEKEND,
)
from tests.api.clients import post
from tests.support.model_cache import start_sharing

pytestmark = pytest.mark.acceptance


@pytest.fixture(scope="module")
def gemma3_cpp(tmp_path_factory):
    """`millm serve --model gemma3-270m --engine llama.cpp`, sharing the converted files of the other Gemma 3 tests."""
    server = start_sharing(
        "gemma3",
        tmp_path_factory.mktemp("gemma3-cpp-home"),
        ["--model", MODEL, "--engine", "llama.cpp"],
    )
    try:
        yield server
    finally:
        server.stop()


def complete(server, prompt: str, max_tokens: int, **extra) -> dict:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    response = post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    assert response.json()["system_fingerprint"].endswith(":llama.cpp")
    return response.json()


def test_the_reading_feature_steers_the_weekend_to_books(gemma3_cpp):
    steering = {
        "steering": [{"sae_id": SAE_ID, "features": [{"index": READING, "strength": STRENGTH}]}]
    }
    plain = complete(gemma3_cpp, WEEKEND, 16)["choices"][0]["text"]
    steered = complete(gemma3_cpp, WEEKEND, 16, steering=steering)["choices"][0]["text"]
    assert "read" not in plain and "book" not in plain, plain
    assert "read" in steered[:20] or "book" in steered[:20], steered


def test_reads_and_a_probe_see_the_dense_feature_at_every_position(gemma3_cpp):
    probe = {
        "name": "dense",
        "detector": {"type": "feature", "sae_id": SAE_ID, "index": DENSE, "threshold": 0.5},
    }
    body = complete(
        gemma3_cpp,
        "The capital of France is Paris.",
        1,
        return_sae_activations={"sae_id": SAE_ID, "positions": "all", "top_k": 32},
        probes=[probe],
    )
    block = body["millm"]["sae_activations"]
    assert block["layer"] == LAYER
    after_bos = [p for p in block["positions"] if p["position"] > 0]
    assert len(after_bos) == body["usage"]["prompt_tokens"] - 1
    for entry in after_bos:
        assert (
            len(entry["features"]) == 32
        )  # a TopK SAE with k = 32: every active feature is listed
        values = {f["index"]: f["value"] for f in entry["features"]}
        assert values.get(DENSE, 0.0) > 0.5, entry
    (verdict,) = body["millm"]["probes"]
    assert verdict["fired"] and verdict["positions"] == [p["position"] for p in after_bos]
