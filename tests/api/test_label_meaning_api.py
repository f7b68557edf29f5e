"""Label search by meaning on a live server (tiny Llama, a TopK SAE at layer 1, labels imported):
a synonym that text search misses is found by meaning and by both, scores are the cosine and the
reciprocal-rank fusion as numbers, a changed label is embedded anew, and with no endpoint the
served model's own /v1/embeddings rank the labels.

The embeddings endpoint here is an OpenAI-compatible server on 127.0.0.1 whose vectors come from
a small word table (a random-weight model has no notion of synonyms); what is under test is
millm's search, not the embedder."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from tests.api.clients import MODEL, api, post
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

# Concept axes: sea, food, music, other.
WORDS = {
    "pirate": [1.0, 0, 0, 0.1],
    "ship": [0.9, 0, 0, 0.2],
    "sea": [1.0, 0, 0, 0],
    "voyage": [0.8, 0, 0.1, 0.1],
    "italian": [0, 1.0, 0, 0.1],
    "food": [0, 0.9, 0, 0.2],
    "pasta": [0, 1.0, 0, 0],
    "music": [0, 0, 1.0, 0],
    "song": [0, 0, 0.9, 0.1],
}
LABELS = {"0": "pirate ship", "1": "italian food", "2": "music song", "3": "river bank"}


def vector(text: str) -> list[float]:
    total = np.zeros(4)
    for word in text.lower().split():
        total += np.asarray(WORDS.get(word, [0, 0, 0, 1.0]))
    return total.tolist()


class Embeddings:
    """POST /v1/embeddings answering from WORDS; counts the texts it embedded."""

    def __init__(self):
        self.texts: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.texts += body["input"]
                data = [
                    {"object": "embedding", "index": i, "embedding": vector(text)}
                    for i, text in enumerate(body["input"])
                ]
                answer = json.dumps({"object": "list", "data": data, "model": body["model"]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer.encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def embeddings():
    endpoint = Embeddings()
    yield endpoint
    endpoint.server.shutdown()


def labelled_server(home, tiny_dirs, sae_dir, env) -> tuple[ServerProcess, str]:
    process = ServerProcess(home, ["--model", str(tiny_dirs["llama"])], env=env).wait_ready()
    sae = post(process, "/api/saes", {"path": str(sae_dir)}).json()["id"]
    assert api(process, "PUT", f"/api/saes/{sae}/labels", json=LABELS).status_code == 200
    return process, sae


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory):
    return build_saelens(tmp_path_factory.mktemp("meaning-sae") / "sae", layer=1, seed=5)


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory, sae_dir, embeddings):
    env = {"MILLM_EMBEDDINGS_BASE_URL": embeddings.url, "MILLM_EMBEDDINGS_MODEL": "words"}
    process, sae = labelled_server(tmp_path_factory.mktemp("meaning-home"), tiny_dirs, sae_dir, env)
    try:
        yield process, sae
    finally:
        process.stop()


def search(process, sae: str, q: str, by: str, limit: int = 10) -> list[dict]:
    response = api(
        process, "GET", f"/api/saes/{sae}/features", params={"q": q, "by": by, "limit": limit}
    )
    assert response.status_code == 200, response.text
    assert response.json()["by"] == by
    return response.json()["data"]


def cosine(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_a_synonym_text_search_misses_is_found_by_meaning_and_by_both(server, embeddings):
    process, sae = server
    assert [m["index"] for m in search(process, sae, "sea voyage", "text")] == []
    by_meaning = search(process, sae, "sea voyage", "meaning")
    assert by_meaning[0]["index"] == 0 and by_meaning[0]["label"] == "pirate ship"
    for match in by_meaning:
        want = cosine(vector("sea voyage"), vector(LABELS[str(match["index"])]))
        assert match["score"] == pytest.approx(want, abs=1e-6)
    assert [m["score"] for m in by_meaning] == sorted(
        (m["score"] for m in by_meaning), reverse=True
    )
    both = search(process, sae, "sea voyage", "both")
    assert both[0]["index"] == 0
    assert both[0]["score"] == pytest.approx(1 / 61)  # first by meaning, absent by text
    embedded = len(embeddings.texts)
    search(process, sae, "italian pasta", "meaning")
    assert len(embeddings.texts) == embedded + 1  # the labels are kept; only the query is embedded


def test_both_fuses_the_two_rankings_by_reciprocal_rank(server):
    process, sae = server
    text = [m["index"] for m in search(process, sae, "music food", "text", 100)]
    meaning = [m["index"] for m in search(process, sae, "music food", "meaning", 100)]
    fused = search(process, sae, "music food", "both", 100)
    for match in fused:
        want = sum(
            1 / (60 + ranks.index(match["index"]) + 1)
            for ranks in (text, meaning)
            if match["index"] in ranks
        )
        assert match["score"] == pytest.approx(want)
    assert {m["index"] for m in fused} == set(text) | set(meaning)


def test_a_changed_label_is_embedded_anew(server):
    process, sae = server
    assert (
        api(process, "PATCH", f"/api/saes/{sae}/labels", json={"3": "pasta food"}).status_code
        == 200
    )
    found = search(process, sae, "italian pasta", "meaning", 2)
    assert {m["index"] for m in found} == {1, 3}
    assert next(m for m in found if m["index"] == 3)["label"] == "pasta food"
    assert (
        api(process, "PATCH", f"/api/saes/{sae}/labels", json={"3": "river bank"}).status_code
        == 200
    )


def test_without_an_endpoint_the_served_models_embeddings_rank_the_labels(
    tiny_dirs, tmp_path_factory, sae_dir
):
    process, sae = labelled_server(
        tmp_path_factory.mktemp("meaning-served"), tiny_dirs, sae_dir, {}
    )
    try:
        texts = ["sea voyage", *LABELS.values()]
        response = post(process, "/v1/embeddings", {"model": MODEL, "input": texts})
        assert response.status_code == 200, response.text
        vectors = [item["embedding"] for item in response.json()["data"]]
        found = search(process, sae, "sea voyage", "meaning")
        assert len(found) == len(LABELS)
        for match in found:
            want = cosine(vectors[0], vectors[1 + list(LABELS).index(str(match["index"]))])
            assert match["score"] == pytest.approx(want, abs=1e-5)
    finally:
        process.stop()


def test_a_job_embeds_the_labels_ahead_of_the_first_search(
    tiny_dirs, tmp_path_factory, sae_dir, embeddings
):
    """POST /api/saes/{id}/labels/embeddings embeds every label once, as a job whose progress is
    the labels; the first search by meaning after it embeds only its query. An SAE with no label
    is a 400 naming it."""
    from tests.api.clients import error, finished_job

    env = {"MILLM_EMBEDDINGS_BASE_URL": embeddings.url, "MILLM_EMBEDDINGS_MODEL": "words"}
    home = tmp_path_factory.mktemp("meaning-job")
    process, sae = labelled_server(home, tiny_dirs, sae_dir, env)
    try:
        before = len(embeddings.texts)
        started = post(process, f"/api/saes/{sae}/labels/embeddings", {})
        assert started.status_code == 202, started.text
        job = finished_job(process, started.json()["id"])
        assert job["state"] == "succeeded", job
        assert job["progress"] == {"done": 4, "total": 4, "unit": "labels"}
        assert job["result"]["embedder"] == "endpoint:words"
        assert sorted(embeddings.texts[before:]) == sorted(LABELS.values())
        found = search(process, sae, "sea voyage", "meaning")
        assert found[0]["label"] == "pirate ship"
        assert embeddings.texts[before + len(LABELS) :] == ["sea voyage"]
        assert api(process, "DELETE", f"/api/saes/{sae}/labels").status_code == 200
        refused = error(post(process, f"/api/saes/{sae}/labels/embeddings", {}), 400)
        assert refused["param"] == "sae_id"
    finally:
        process.stop()
