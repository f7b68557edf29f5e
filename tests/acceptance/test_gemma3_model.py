"""Acceptance on the second packaged model: Gemma 3 270M (base, Q4_K_M GGUF), served offline as
`millm serve --model gemma3-270m`, on the lean runner with its sliding-window layers batched, and
steered through the SAE trained for it (millm/demo/sae/gemma3-270m-topk)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from millm.engine.sources import GEMMA3_MODEL_NAME
from tests.api.clients import post, sdk
from tests.support.server import ServerProcess

pytestmark = pytest.mark.acceptance
MODEL = GEMMA3_MODEL_NAME
CAPITALS = "The capital of France is Paris. The capital of Germany is"
WEEKEND = "My favourite thing to do on the weekend is"
# Found by scripts/train_demo_sae.py --model gemma3-270m (see the SAE's README).
FEATURE, STRENGTH, WORDS = None, None, ()
READ_FEATURE = None


@pytest.fixture(scope="module")
def gemma3_server(tmp_path_factory):
    """`millm serve --model gemma3-270m` (float32 on the lean runner, continuous batching on by default)."""
    server = ServerProcess(tmp_path_factory.mktemp("gemma3-home"), ["--model", MODEL])
    try:
        yield server.wait_ready(timeout=600)
    finally:
        server.stop()


def complete(server, prompt: str, max_tokens: int = 12, **extra) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    response = post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_a_sensible_greedy_answer_on_the_lean_runner(gemma3_server):
    assert complete(gemma3_server, CAPITALS, 3).startswith(" Berlin")
    answer = sdk(gemma3_server).completions.create(model=MODEL, prompt=CAPITALS, max_tokens=1, temperature=0)
    assert answer.system_fingerprint.startswith("millm:gemma3-270m@a5fd3b62:float32/Q4_K_M:transformers")
    health = httpx.get(f"{gemma3_server.base_url}/api/health/inference", timeout=30).json()
    assert health["runner"] == "lean (gemma3_text)" and health["continuous_batching"]["unavailable"] is None


def test_concurrent_requests_batch_and_equal_their_solo_answers(gemma3_server):
    """Prompts and answers run past nothing here (the window is 512), but the rows really share batches."""
    prompts = [CAPITALS, WEEKEND, "def fibonacci(n):", "Once upon a time, in a small village,"]
    solo = [complete(gemma3_server, p, 24) for p in prompts]
    before = httpx.get(f"{gemma3_server.base_url}/api/health/inference", timeout=30).json()["jobs"]["batched"]["served"]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: complete(gemma3_server, p, 24), prompts))
    assert together == solo  # float32: a row's tokens do not depend on its batch
    health = httpx.get(f"{gemma3_server.base_url}/api/health/inference", timeout=30).json()
    assert health["backend"] == "batched" and health["jobs"]["batched"]["served"] == before + len(prompts)
