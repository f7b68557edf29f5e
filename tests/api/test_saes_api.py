"""/api/saes: register, list, get, delete, attach, detach, feature search; every refusal a clear
400/404/409."""

import pytest

from tests.api.clients import api, error
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_gemma_scope, build_saelens, sae_tensors


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    process = ServerProcess(
        tmp_path_factory.mktemp("saes-home"), ["--model", str(tiny_dirs["llama"])]
    )
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    base = tmp_path_factory.mktemp("sae-files")
    return {
        "topk": build_saelens(base / "topk", layer=1, seed=1),
        "relu": build_saelens(base / "relu", layer=2, architecture="standard", seed=2),
        "gemma": build_gemma_scope(base / "layer_2" / "width" / "params.npz", seed=3),
        "wide": build_saelens(base / "wide", d_in=32, layer=1, seed=4),
        "deep": build_saelens(base / "deep", layer=7, seed=5),
        "broken": build_saelens(
            base / "broken",
            architecture="standard",
            tensors={k: v for k, v in sae_tensors(64, 128).items() if k != "b_enc"},
        ),
    }


def register(server, path):
    response = api(server, "POST", "/api/saes", json={"path": str(path)})
    assert response.status_code in (200, 201), response.text
    return response.json()


def test_register_is_idempotent_by_content(server, files):
    first = api(server, "POST", "/api/saes", json={"path": str(files["topk"])})
    assert first.status_code == 201
    again = api(server, "POST", "/api/saes", json={"path": str(files["topk"])})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    ids = [s["id"] for s in api(server, "GET", "/api/saes").json()["data"]]
    assert ids.count(first.json()["id"]) == 1
    got = api(server, "GET", f"/api/saes/{first.json()['id']}").json()
    assert (
        got["architecture"] == "topk"
        and got["d_sae"] == 128
        and got["layer"] == 1
        and got["attached"] is False
    )


def test_gemma_scope_registers_with_its_layer(server, files):
    info = register(server, files["gemma"])
    assert (
        info["format"] == "gemma_scope"
        and info["architecture"] == "jumprelu"
        and info["layer"] == 2
    )


def test_malformed_file_is_a_400_naming_the_problem(server, files):
    body = error(
        api(server, "POST", "/api/saes", json={"path": str(files["broken"])}), 400, "invalid_sae"
    )
    assert "has no tensor 'b_enc'" in body["message"]
    missing = error(
        api(server, "POST", "/api/saes", json={"path": str(files["broken"].parent / "nowhere")}),
        400,
    )
    # inside the allowed folders, existence is told
    assert "no file or directory" in missing["message"]
    error(api(server, "POST", "/api/saes", json={}), 400)
    error(api(server, "POST", "/api/saes", json={"path": 5}), 400)


def test_hub_sae_offline_is_a_clear_400(server):
    body = error(
        api(
            server,
            "POST",
            "/api/saes",
            json={"repo": "acme/no-such-saes", "path": "layer_1/width_16k"},
        ),
        400,
    )
    assert "acme/no-such-saes" in body["message"]


def test_attach_detach_and_figures_on_misfit(server, files):
    sae = register(server, files["topk"])["id"]
    attached = api(server, "POST", f"/api/saes/{sae}/attach").json()
    assert attached["attached"] and attached["layer"] == 1
    assert api(server, "GET", f"/api/saes/{sae}").json()["attached_layer"] == 1
    moved = api(server, "POST", f"/api/saes/{sae}/attach", json={"layer": 0}).json()
    assert moved["layer"] == 0
    wide = register(server, files["wide"])["id"]
    body = error(api(server, "POST", f"/api/saes/{wide}/attach"), 400, "sae_model_mismatch")
    assert "d_in=32" in body["message"] and "hidden size 64" in body["message"]
    deep = register(server, files["deep"])["id"]
    body = error(api(server, "POST", f"/api/saes/{deep}/attach"), 400, "sae_model_mismatch")
    assert "layer 7" in body["message"] and "3 layers" in body["message"]
    error(api(server, "POST", f"/api/saes/{sae}/attach", json={"layer": -1}), 400)
    detached = api(server, "POST", f"/api/saes/{sae}/detach").json()
    assert detached["was_attached"] and not detached["attached"]


def test_several_saes_attach_at_different_layers(server, files):
    a, b = register(server, files["topk"])["id"], register(server, files["relu"])["id"]
    api(server, "POST", f"/api/saes/{a}/attach")
    api(server, "POST", f"/api/saes/{b}/attach")
    steering = api(server, "GET", "/api/steering").json()
    layers = {s["sae_id"]: s["layer"] for s in steering["saes"] if s["attached"]}
    assert layers[a] == 1 and layers[b] == 2
    api(server, "POST", f"/api/saes/{a}/detach")
    api(server, "POST", f"/api/saes/{b}/detach")


def test_delete_refuses_an_attached_sae(server, files):
    sae = register(server, files["relu"])["id"]
    api(server, "POST", f"/api/saes/{sae}/attach")
    error(api(server, "DELETE", f"/api/saes/{sae}"), 409, "sae_attached")
    api(server, "POST", f"/api/saes/{sae}/detach")
    assert api(server, "DELETE", f"/api/saes/{sae}").json()["deleted"]
    error(api(server, "GET", f"/api/saes/{sae}"), 404, "sae_not_found")
    error(api(server, "POST", f"/api/saes/{sae}/attach"), 404, "sae_not_found")


def test_feature_label_search(server, files):
    sae = register(server, files["topk"])["id"]
    found = api(
        server, "GET", f"/api/saes/{sae}/features", params={"q": "PARIS", "limit": 3}
    ).json()
    assert [f["index"] for f in found["data"]] == [0, 10, 20]
    assert all("paris" in f["label"] for f in found["data"])
    assert (
        len(api(server, "GET", f"/api/saes/{sae}/features", params={"limit": 1000}).json()["data"])
        == 128
    )
    gemma = register(server, files["gemma"])["id"]
    empty = api(server, "GET", f"/api/saes/{gemma}/features", params={"q": "x"}).json()
    assert empty["has_labels"] is False and empty["data"] == []


def test_hub_sae_from_the_local_hub_cache(server, files):
    """A hub repo + path resolves through huggingface_hub's cache under MILLM_HOME/hub (offline
    here)."""
    import shutil

    commit = "89abcdef0123456789abcdef0123456789abcdef"
    repo = server.log_path.parent / "hub" / "models--acme--tiny-saes"
    shutil.copytree(files["relu"], repo / "snapshots" / commit / "layer_2" / "width_128")
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    response = api(
        server, "POST", "/api/saes", json={"repo": "acme/tiny-saes", "path": "layer_2/width_128"}
    )
    assert response.status_code in (200, 201), response.text
    assert response.json()["architecture"] == "standard" and response.json()["layer"] == 2
