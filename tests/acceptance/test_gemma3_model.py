"""Acceptance on the second packaged model: Gemma 3 270M (base, Q4_K_M GGUF), served offline as
`millm serve --model gemma3-270m`, on the lean runner with its sliding-window layers batched, and
steered through the SAE trained for it (millm/demo/sae/gemma3-270m-topk); and the same file on
llama.cpp (scaled embeddings, its own norms), read, probed and steered inside llama.cpp's graph."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from millm.engine.sources import GEMMA3_MODEL_NAME
from tests.api.clients import post, sdk
from tests.support.model_cache import start_sharing

pytestmark = pytest.mark.acceptance
MODEL = GEMMA3_MODEL_NAME
CAPITALS = "The capital of France is Paris. The capital of Germany is"
WEEKEND = "My favourite thing to do on the weekend is"
# From scripts/build_demo_sae.py --model gemma3-270m (see the SAE's README): feature 1346 ("read /
# reading / reads") turns the weekend to books at strength 2 (its decoder rows have norm 249.7);
# feature 1780 is dense: it fires on every token after <bos> of the Paris sentence, at 0.33 or
# more on both engines.
SAE_ID, LAYER = "sae_fded20dda256", 9
READING, STRENGTH = 1346, 2.0
DENSE, DENSE_FLOOR = 1780, 0.2


@pytest.fixture(scope="module")
def gemma3_server(tmp_path_factory):
    """`millm serve --model gemma3-270m --engine transformers` (float32 on the lean runner) with
    continuous batching on."""
    server = start_sharing(
        "gemma3",
        tmp_path_factory.mktemp("gemma3-home"),
        ["--model", MODEL, "--engine", "transformers"],
        env={"ENABLE_CONTINUOUS_BATCHING": "true"},
    )
    try:
        yield server
    finally:
        server.stop()


def complete(server, prompt: str, max_tokens: int = 12, **extra) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    response = post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_a_sensible_greedy_answer_on_the_lean_runner(gemma3_server):
    assert complete(gemma3_server, CAPITALS, 3).startswith(" Berlin")
    answer = sdk(gemma3_server).completions.create(
        model=MODEL, prompt=CAPITALS, max_tokens=1, temperature=0
    )
    assert answer.system_fingerprint.startswith(
        "millm:gemma3-270m@a5fd3b62:float32/Q4_K_M:transformers"
    )
    health = httpx.get(f"{gemma3_server.base_url}/api/health/inference", timeout=30).json()
    assert (
        health["runner"] == "lean (gemma3_text)"
        and health["continuous_batching"]["unavailable"] is None
    )


def steering(strength: float = STRENGTH) -> dict:
    return {
        "steering": {
            "steering": [{"sae_id": SAE_ID, "features": [{"index": READING, "strength": strength}]}]
        }
    }


def test_the_shipped_sae_is_attached_with_labels(gemma3_server):
    saes = httpx.get(f"{gemma3_server.base_url}/api/saes", timeout=30).json()["data"]
    assert [(s["id"], s["attached"], s["attached_layer"], s["d_sae"]) for s in saes] == [
        (SAE_ID, True, LAYER, 2048)
    ]
    found = httpx.get(
        f"{gemma3_server.base_url}/api/saes/{SAE_ID}/features", params={"q": "reading"}, timeout=30
    ).json()["data"]
    assert READING in [f["index"] for f in found]


def test_a_feature_steers_the_completion(gemma3_server):
    plain = complete(gemma3_server, WEEKEND, 16)
    steered = complete(gemma3_server, WEEKEND, 16, **steering())
    # The greedy words differ a little between CPU kinds (float32 kernels), the topic does not: "to
    # go to the beach" here, "to read a book" steered.
    assert "read" not in plain and "book" not in plain, plain
    assert "read" in steered[:20] or "book" in steered[:20], steered


def dense_at_every_position(body: dict) -> list[int]:
    """Assert the read lists all 32 active features at every position after <bos>, the dense
    feature among them; those positions."""
    block = body["millm"]["sae_activations"]
    assert block["layer"] == LAYER
    after_bos = [p for p in block["positions"] if p["position"] > 0]
    assert len(after_bos) == body["usage"]["prompt_tokens"] - 1
    for entry in after_bos:
        # a TopK SAE with k = 32: every active feature is listed
        assert len(entry["features"]) == 32
        values = {f["index"]: f["value"] for f in entry["features"]}
        assert values.get(DENSE, 0.0) > DENSE_FLOOR, entry
    return [p["position"] for p in after_bos]


def test_reads_see_a_dense_feature_at_every_position(gemma3_server):
    body = {
        "model": MODEL,
        "prompt": "The capital of France is Paris.",
        "max_tokens": 1,
        "temperature": 0,
        "return_sae_activations": {"sae_id": SAE_ID, "positions": "all", "top_k": 32},
    }
    response = post(gemma3_server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    dense_at_every_position(response.json())


def test_concurrent_requests_batch_and_equal_their_solo_answers(gemma3_server):
    """Rows of several requests, one of them steered, share batches and answer as they do alone
    (float32)."""
    requests = [
        (CAPITALS, {}),
        (WEEKEND, {}),
        (WEEKEND, steering()),
        ("def fibonacci(n):", {}),
        ("Once upon a time, in a small village,", {}),
    ]
    solo = [complete(gemma3_server, p, 24, **extra) for p, extra in requests]
    before = httpx.get(f"{gemma3_server.base_url}/api/health/inference", timeout=30).json()["jobs"][
        "batched"
    ]["served"]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(
            pool.map(
                lambda request: complete(gemma3_server, request[0], 24, **request[1]), requests
            )
        )
    assert together == solo  # float32: a row's tokens do not depend on its batch
    assert together[2] != together[1]  # the steered row stayed steered beside its unsteered twin
    health = httpx.get(f"{gemma3_server.base_url}/api/health/inference", timeout=30).json()
    assert health["backend"] == "batched" and health["jobs"]["batched"]["served"] == before + len(
        requests
    )
    assert health["peak_batch_size"] >= 2  # they did share a step


# ---- the same file on llama.cpp: reads, probes and steering inside its graph ---------------------
@pytest.fixture(scope="module")
def gemma3_cpp(gemma3_server, tmp_path_factory):
    """`millm serve --model gemma3-270m` (llama.cpp, the default for a GGUF file), started after
    the transformers server so that it reads the file's tokenizer from that server's converted
    copy (a second, not ~20)."""
    server = start_sharing(
        "gemma3",
        tmp_path_factory.mktemp("gemma3-cpp-home"),
        ["--model", MODEL],
    )
    try:
        yield server
    finally:
        server.stop()


def complete_on_cpp(server, prompt: str, max_tokens: int, **extra) -> dict:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    response = post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    assert response.json()["system_fingerprint"].endswith(":llama.cpp")
    return response.json()


def test_the_reading_feature_steers_the_weekend_to_books(gemma3_cpp):
    plain = complete_on_cpp(gemma3_cpp, WEEKEND, 16)["choices"][0]["text"]
    steered = complete_on_cpp(gemma3_cpp, WEEKEND, 16, **steering())["choices"][0]["text"]
    assert "read" not in plain and "book" not in plain, plain
    assert "read" in steered[:20] or "book" in steered[:20], steered


def test_reads_and_a_probe_see_the_dense_feature_at_every_position(gemma3_cpp):
    probe = {
        "name": "dense",
        "detector": {"type": "feature", "sae_id": SAE_ID, "index": DENSE, "threshold": DENSE_FLOOR},
    }
    body = complete_on_cpp(
        gemma3_cpp,
        "The capital of France is Paris.",
        1,
        return_sae_activations={"sae_id": SAE_ID, "positions": "all", "top_k": 32},
        probes=[probe],
    )
    after_bos = dense_at_every_position(body)
    (verdict,) = body["millm"]["probes"]
    assert verdict["fired"] and verdict["positions"] == after_bos


def test_the_logit_lens_reads_gemmas_blocks_on_llamacpp(gemma3_cpp):
    """The file's own final norm (Gemma's 1 + weight, folded in by llama.cpp's converter) and tied
    head over llama.cpp's block outputs: the last block predicts the token llama.cpp itself
    picks, with nearly the probability its logits give."""
    answer = post(gemma3_cpp, "/api/lens", {"text": CAPITALS, "positions": "last", "top_k": 3})
    assert answer.status_code == 200, answer.text
    (last,) = answer.json()["predictions"]
    scored = complete_on_cpp(gemma3_cpp, CAPITALS, 1, logprobs=1)
    chosen = scored["choices"][0]["logprobs"]
    assert last["final"]["token"] == chosen["tokens"][0] == " Berlin"
    assert last["final"]["probability"] == pytest.approx(
        math.exp(chosen["token_logprobs"][0]), abs=0.05
    )
