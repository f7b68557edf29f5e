"""A published SAE by its SAELens name, from a local Hugging Face cache (offline): `--sae` at
start-up, POST /api/saes with release + sae_id, the releases routes, and its labels fetched from
Neuronpedia (a stand-in on 127.0.0.1 answering Neuronpedia's export route)."""

import gzip
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.api.clients import api, error, post
from tests.support.hub_cache import put
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_gemma_scope, build_gemma_scope_2

sae_releases = pytest.importorskip("millm.interp.sae_releases")
pytest.importorskip("sae_lens")

RELEASE, SAE_ID = "gemma-scope-2b-pt-res-canonical", "layer_1/width_16k/canonical"
RELEASE_2, SAE_ID_2 = "gemma-scope-2-270m-pt-res-all", "layer_1_width_16k_l0_big"


class Neuronpedia:
    """Answers GET /api/explanation/export?modelId=..&saeId=.. and /files/<name> from
    `documents`."""

    def __init__(self, documents: dict[str, bytes]):
        self.documents, self.asked = documents, []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                stand_in.asked.append(self.path)
                body = stand_in.documents.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def explanations(model_id: str, layer: str, count: int, word: str) -> list[dict]:
    return [
        {
            "modelId": model_id,
            "layer": layer,
            "index": str(i),
            "description": f"{word} {i}",
            "explanationModelName": "gpt-4o-mini",
            "typeName": "oai_token-act-pair",
        }
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A Hugging Face cache holding tiny files at the folders SAELens's registry names."""
    base = tmp_path_factory.mktemp("published")
    cache = base / "hf"
    gemma = sae_releases.find(RELEASE, SAE_ID)
    npz = build_gemma_scope(base / "src" / "layer_1" / "params.npz", seed=11)
    put(cache, gemma.repo, f"{gemma.path}/params.npz", npz)
    gemma_2 = sae_releases.find(RELEASE_2, SAE_ID_2)
    put(cache, gemma_2.repo, gemma_2.path, build_gemma_scope_2(base / "src2" / "layer_1", seed=12))
    model_id, layer = gemma.neuronpedia_id.split("/")
    export = f"/api/explanation/export?modelId={model_id}&saeId={layer}"
    lines = b"\n".join(json.dumps(e).encode() for e in explanations(model_id, layer, 128, "river"))
    neuronpedia = Neuronpedia(
        {
            export: json.dumps(explanations(model_id, layer, 128, "paris")).encode(),
            "/files/batch-0.jsonl.gz": gzip.compress(lines),
        }
    )
    return {"cache": cache, "gemma": gemma, "neuronpedia": neuronpedia, "export": export}


@pytest.fixture(scope="module")
def server(tiny_dirs, hub, tmp_path_factory):
    process = ServerProcess(
        tmp_path_factory.mktemp("published-home"),
        [
            "--model",
            str(tiny_dirs["llama"]),
            "--sae",
            f"{RELEASE}:{SAE_ID}",
            "--sae-labels",
            "neuronpedia",
        ],
        env={"HF_HUB_CACHE": str(hub["cache"]), "MILLM_NEURONPEDIA_URL": hub["neuronpedia"].url},
    )
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def test_sae_named_at_start_up_is_attached_with_its_names_and_labels(server, hub):
    saes = api(server, "GET", "/api/saes").json()["data"]
    assert len(saes) == 1
    sae = saes[0]
    assert sae["attached"] is True and sae["layer"] == 1 and sae["format"] == "gemma_scope"
    assert (sae["release"], sae["release_sae_id"]) == (RELEASE, SAE_ID)
    assert (
        sae["neuronpedia_id"] == hub["gemma"].neuronpedia_id and sae["model_name"] == "gemma-2-2b"
    )
    assert hub["export"] in hub["neuronpedia"].asked
    feature = api(server, "GET", f"/api/saes/{sae['id']}/features/7").json()
    assert feature["label"] == "paris 7"


def test_the_published_sae_steers_a_chat(server):
    body = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "the river"}],
        "max_tokens": 2,
        "temperature": 0,
        "return_sae_activations": {"positions": "last", "features": [3]},
    }

    def feature_3(extra: dict) -> float:
        answer = post(server, "/v1/chat/completions", {**body, **extra})
        assert answer.status_code == 200, answer.text
        position = answer.json()["millm"]["sae_activations"]["positions"][-1]
        return next((f["value"] for f in position["features"] if f["index"] == 3), 0.0)

    sae = api(server, "GET", "/api/saes").json()["data"][0]["id"]
    plain = feature_3({})
    steering = [{"sae_id": sae, "features": [{"index": 3, "op": "clamp", "value": 40.0}]}]
    steered = feature_3({"steering": {"steering": steering}})
    # read after the layer's steering: the clamp holds feature 3 at 40 where it read otherwise
    assert plain != pytest.approx(40.0, abs=1.0)
    assert steered == pytest.approx(40.0, abs=0.05)


def test_register_by_release_and_id(server):
    created = api(server, "POST", "/api/saes", json={"release": RELEASE_2, "sae_id": SAE_ID_2})
    assert created.status_code == 201, created.text
    sae = created.json()
    assert (sae["format"], sae["layer"], sae["release"]) == ("gemma_scope_2", 1, RELEASE_2)
    again = api(server, "POST", "/api/saes", json={"release": RELEASE_2, "sae_id": SAE_ID_2})
    assert again.status_code == 200 and again.json()["id"] == sae["id"]


def test_register_by_one_name_as_the_workbench_does(server):
    created = api(server, "POST", "/api/saes", json={"sae": f"{RELEASE_2}:{SAE_ID_2}"})
    assert created.status_code in (200, 201), created.text
    assert created.json()["release_sae_id"] == SAE_ID_2
    gemma = sae_releases.find(RELEASE, SAE_ID)
    by_repo = api(server, "POST", "/api/saes", json={"sae": f"{gemma.repo}:{gemma.path}"})
    assert by_repo.status_code == 200 and by_repo.json()["release"] == RELEASE  # the same file
    error(api(server, "POST", "/api/saes", json={"sae": "/etc"}), 403)
    error(api(server, "POST", "/api/saes", json={"sae": "x", "path": "/tmp"}), 400)


@pytest.mark.parametrize(
    ("body", "code", "says"),
    [
        ({"release": RELEASE + "x", "sae_id": SAE_ID}, "unknown_sae_release", "did you mean"),
        (
            {"release": RELEASE, "sae_id": "layer_1/width_16k/canonicl"},
            "unknown_sae_id",
            "did you mean",
        ),
        ({"release": RELEASE, "sae_id": SAE_ID, "path": "x"}, None, "give one of"),
        ({"release": RELEASE}, None, "go together"),
        (
            {"release": "qwen-scope-qwen3-1.7b-base-res-32k-k50", "sae_id": "layer_1"},
            "invalid_sae",
            None,
        ),
    ],
)
def test_bad_release_registrations_are_named(server, body, code, says):
    if body.get("release", "").startswith("qwen") and "qwen" not in json.dumps(
        [r["release"] for r in sae_releases.releases_view("qwen")]
    ):
        pytest.skip("no Qwen Scope release in this sae-lens")
    if body.get("release", "").startswith("qwen"):
        name = next(r for r in sae_releases.releases_view("qwen") if not r["readable"])["release"]
        body = {"release": name, "sae_id": sae_releases.release_view(name)["saes"][0]["sae_id"]}
    refused = error(api(server, "POST", "/api/saes", json=body), 400, code)
    assert says is None or says in refused["message"]


def test_releases_routes(server):
    listed = api(server, "GET", "/api/saes/releases", params={"model": "gemma-2-2b"}).json()["data"]
    assert RELEASE in {row["release"] for row in listed}
    one = api(server, "GET", f"/api/saes/releases/{RELEASE}").json()
    assert one["layout"] == "Gemma Scope" and SAE_ID in {s["sae_id"] for s in one["saes"]}
    assert api(server, "GET", "/api/saes/releases/nope").status_code == 400


def test_labels_from_a_url_gzipped_json_lines(server, hub):
    sae = api(server, "GET", "/api/saes").json()["data"][0]["id"]
    url = hub["neuronpedia"].url + "/files/batch-0.jsonl.gz"
    done = api(server, "POST", f"/api/saes/{sae}/labels/import", json={"source": url})
    assert done.status_code == 200, done.text
    assert done.json()["imported"] == 128 and done.json()["format"] == "neuronpedia"
    assert api(server, "GET", f"/api/saes/{sae}/features/7").json()["label"] == "river 7"
    missing = api(server, "POST", f"/api/saes/{sae}/labels/import", json={"source": url + "x"})
    error(missing, 400, "labels_unreachable")
    outside = api(server, "POST", f"/api/saes/{sae}/labels/import", json={"source": "/etc/passwd"})
    assert outside.status_code == 403


def test_a_wrong_sae_name_stops_the_start(tiny_dirs, hub, tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "millm",
            "serve",
            "--home",
            str(tmp_path),
            "--model",
            str(tiny_dirs["llama"]),
            "--sae",
            f"{RELEASE}:layer_1/width_16k/canonicl",
        ],
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub["cache"])},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "is not in SAELens's registry" in done.stderr and "did you mean" in done.stderr


def test_a_start_up_sae_that_does_not_fit_keeps_the_server_unready(
    tiny_dirs, hub, tmp_path_factory
):
    wide = build_gemma_scope(tmp_path_factory.mktemp("wide") / "layer_1" / "params.npz", d_in=32)
    process = ServerProcess(
        tmp_path_factory.mktemp("unfit-home"),
        ["--model", str(tiny_dirs["llama"]), "--sae", str(wide)],
    )
    try:
        for _ in range(600):
            ready = (
                httpx.get(f"{process.base_url}/api/health/ready", timeout=2)
                if _port_open(process)
                else None
            )
            if ready is not None and ready.json().get("status") not in ("loading", "not_loaded"):
                break
            __import__("time").sleep(0.2)
        assert ready is not None and ready.status_code == 503
        assert ready.json()["status"] == "sae_not_attached"
        assert (
            "could not be attached" in ready.json()["error"] and str(wide) in ready.json()["error"]
        )
    finally:
        process.stop()


def _port_open(process) -> bool:
    try:
        httpx.get(f"{process.base_url}/api/health", timeout=1)
        return True
    except httpx.HTTPError:
        return False
