"""/api/models on a live server: register, list, get, load, unload, delete, lock, unlock; a request
naming another registered model loads it; /v1/models follows the states and the steering lock;
registrations and the lock survive a restart."""

import pytest

from tests.api.clients import MODEL, api, post, sdk
from tests.api.clients import error as shared_error
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

GEMMA = "tiny-gemma2"
USER = [{"role": "user", "content": "Hello! How are you today?"}]


def error(response, status, code, type_="invalid_request_error"):
    return shared_error(response, status, code, type_)


def states(server) -> dict[str, str]:
    return {m["id"]: m["state"] for m in api(server, "GET", "/api/models").json()["data"]}


def listed(server) -> list[str]:
    return [m["id"] for m in api(server, "GET", "/v1/models").json()["data"]]


def chat(server, model, **extra):
    return post(
        server,
        "/v1/chat/completions",
        {"model": model, "messages": USER, "max_tokens": 3, "temperature": 0, **extra},
    )


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    process = ServerProcess(
        tmp_path_factory.mktemp("models-home"), ["--model", str(tiny_dirs["llama"])]
    )
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.fixture(scope="module")
def gemma(server, tiny_dirs):
    response = api(server, "POST", "/api/models", json={"source": str(tiny_dirs["gemma2"])})
    assert response.status_code in (200, 201), response.text
    return response.json()


@pytest.fixture(autouse=True)
def tiny_llama_loaded_and_unlocked(server):
    """Every test starts from the start-up state: tiny-llama loaded, nothing locked or attached."""
    yield
    for sae in api(server, "GET", "/api/saes").json()["data"]:
        api(server, "POST", f"/api/saes/{sae['id']}/detach")
    locked = api(server, "GET", "/api/models").json()["locked"]
    if locked:
        assert api(server, "POST", f"/api/models/{locked}/unlock").status_code == 200
    assert api(server, "POST", f"/api/models/{MODEL}/load").status_code == 200


def test_the_start_up_model_is_registered_under_its_served_name(server, tiny_dirs):
    body = api(server, "GET", "/api/models").json()
    assert body["object"] == "list" and body["locked"] is None
    first = body["data"][0]
    assert (
        first["id"] == MODEL
        and first["state"] == "loaded"
        and first["source"] == str(tiny_dirs["llama"])
    )
    assert (
        first["kind"] == "directory"
        and first["loaded"]["max_model_len"] == 2048
        and first["loaded"]["device"] == "cpu"
    )
    assert first["loaded"]["system_fingerprint"].startswith(f"millm:{MODEL}@")
    assert api(server, "GET", f"/api/models/{MODEL}").json()["state"] == "loaded"
    error(api(server, "GET", "/api/models/no-such-model"), 404, "model_not_found")


def test_register_then_list_get_and_register_again(server, gemma, tiny_dirs):
    assert gemma["id"] == GEMMA and gemma["state"] == "ready" and gemma["kind"] == "directory"
    assert gemma["parameters"] > 100_000 and "loaded" not in gemma and "error" not in gemma
    again = api(server, "POST", "/api/models", json={"source": str(tiny_dirs["gemma2"])})
    assert again.status_code == 200 and again.json()["id"] == GEMMA
    clash = api(
        server, "POST", "/api/models", json={"source": str(tiny_dirs["llama-plain"]), "name": GEMMA}
    )
    assert "already registered" in error(clash, 409, "model_exists")["message"]
    assert states(server) == {MODEL: "loaded", GEMMA: "ready"}
    assert listed(server) == [MODEL, GEMMA]  # ready models are available too
    card = api(server, "GET", f"/v1/models/{GEMMA}").json()
    assert card["id"] == GEMMA and card["object"] == "model" and card["owned_by"] == "local"
    assert (
        "max_model_len" not in card
        and "max_model_len" in api(server, "GET", f"/v1/models/{MODEL}").json()
    )


def test_registration_refusals(server, tmp_path):
    missing = api(server, "POST", "/api/models", json={"source": str(tmp_path / "nothing-here")})
    assert str(tmp_path / "nothing-here") in error(missing, 400, "invalid_model_source")["message"]
    (tmp_path / "empty").mkdir()
    error(
        api(server, "POST", "/api/models", json={"source": str(tmp_path / "empty")}),
        400,
        "invalid_model_source",
    )
    error(
        api(server, "POST", "/api/models", json={"source": str(tmp_path), "colour": "red"}),
        400,
        "invalid_parameter",
    )
    error(api(server, "POST", "/api/models", json={}), 400, "invalid_parameter")


def test_a_request_naming_another_registered_model_loads_it(server, gemma):
    client = sdk(server)
    answer = client.chat.completions.create(model=GEMMA, messages=USER, max_tokens=3, temperature=0)
    assert answer.model == GEMMA and answer.system_fingerprint.startswith(f"millm:{GEMMA}@")
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert states(server) == {MODEL: "ready", GEMMA: "loaded"}
    ready = api(server, "GET", "/api/health/ready").json()
    assert ready["status"] == "ready" and ready["model"] == GEMMA
    # Every /v1 route loads on demand, embeddings and text completions too.
    embedded = post(server, "/v1/embeddings", {"model": MODEL, "input": "The cat"})
    assert embedded.status_code == 200 and embedded.json()["model"] == MODEL
    assert states(server)[MODEL] == "loaded"
    completed = post(
        server, "/v1/completions", {"model": GEMMA, "prompt": "The cat", "max_tokens": 2}
    )
    assert completed.status_code == 200 and completed.json()["model"] == GEMMA
    # An unknown name is still a 404, and loads nothing.
    error(chat(server, "gpt-4o"), 404, "model_not_found")
    assert states(server)[GEMMA] == "loaded"


def test_load_and_unload_by_the_management_api(server, gemma):
    loaded = api(server, "POST", f"/api/models/{GEMMA}/load")
    assert (
        loaded.status_code == 200
        and loaded.json()["state"] == "loaded"
        and loaded.json()["loaded"]["dtype"] == "float32"
    )
    # already loaded: no change
    assert api(server, "POST", f"/api/models/{GEMMA}/load").json()["state"] == "loaded"
    unloaded = api(server, "POST", f"/api/models/{GEMMA}/unload").json()
    assert unloaded["was_loaded"] is True and unloaded["state"] == "ready"
    assert states(server) == {MODEL: "ready", GEMMA: "ready"}
    ready = api(server, "GET", "/api/health/ready")
    assert ready.status_code == 503 and ready.json()["status"] == "unloaded"
    assert api(server, "POST", f"/api/models/{GEMMA}/unload").json()["was_loaded"] is False
    # Nothing loaded: a request names a model and it loads.
    assert chat(server, MODEL).status_code == 200
    assert api(server, "GET", "/api/health/ready").status_code == 200
    error(api(server, "POST", "/api/models/no-such-model/load"), 404, "model_not_found")
    error(api(server, "POST", "/api/models/no-such-model/unload"), 404, "model_not_found")


def test_delete_refuses_the_loaded_model(server, tiny_dirs):
    error(api(server, "DELETE", f"/api/models/{MODEL}"), 409, "model_loaded")
    created = api(
        server,
        "POST",
        "/api/models",
        json={"source": str(tiny_dirs["llama-plain"]), "name": "plain"},
    )
    assert created.status_code == 201 and created.json()["id"] == "plain"
    assert chat(server, "plain").status_code == 200
    error(api(server, "DELETE", "/api/models/plain"), 409, "model_loaded")
    api(server, "POST", "/api/models/plain/unload")
    assert api(server, "DELETE", "/api/models/plain").json() == {
        "id": "plain",
        "object": "model",
        "deleted": True,
    }
    error(api(server, "GET", "/api/models/plain"), 404, "model_not_found")
    error(chat(server, "plain"), 404, "model_not_found")
    assert "plain" not in listed(server)
    error(api(server, "DELETE", "/api/models/plain"), 404, "model_not_found")


def test_lock_serves_and_lists_only_the_locked_model(server, gemma):
    locked = api(server, "POST", f"/api/models/{MODEL}/lock").json()
    assert locked["locked"] is True and api(server, "GET", "/api/models").json()["locked"] == MODEL
    assert listed(server) == [MODEL]
    error(api(server, "GET", f"/v1/models/{GEMMA}"), 404, "model_not_found")
    refused = error(chat(server, GEMMA), 409, "model_locked")
    assert MODEL in refused["message"] and "unlock" in refused["message"]
    error(chat(server, GEMMA, stream=True), 409, "model_locked")
    error(api(server, "POST", f"/api/models/{GEMMA}/load"), 409, "model_locked")
    error(api(server, "POST", f"/api/models/{GEMMA}/lock"), 409, "model_locked")
    error(api(server, "POST", f"/api/models/{GEMMA}/unlock"), 409, "model_locked")
    assert states(server) == {MODEL: "loaded", GEMMA: "ready"}  # nothing was reloaded
    assert chat(server, MODEL).status_code == 200
    unlocked = api(server, "POST", f"/api/models/{MODEL}/unlock").json()
    assert unlocked["was_locked"] is True and unlocked["locked"] is False
    assert api(server, "POST", f"/api/models/{MODEL}/unlock").json()["was_locked"] is False
    assert listed(server) == [MODEL, GEMMA]
    assert chat(server, GEMMA).status_code == 200


def test_locking_a_model_that_is_not_loaded(server, gemma):
    assert api(server, "POST", f"/api/models/{GEMMA}/lock").json()["state"] == "ready"
    assert listed(server) == [GEMMA]
    error(chat(server, MODEL), 409, "model_locked")  # the loaded model is no longer served
    error(api(server, "DELETE", f"/api/models/{GEMMA}"), 409, "model_locked")
    assert chat(server, GEMMA).status_code == 200  # the locked model loads on demand
    assert states(server) == {MODEL: "ready", GEMMA: "loaded"}
    assert api(server, "POST", f"/api/models/{GEMMA}/unlock").json()["was_locked"] is True


def test_attaching_an_sae_locks_and_unlock_waits_for_detach(server, gemma, tmp_path):
    sae = api(
        server,
        "POST",
        "/api/saes",
        json={"path": str(build_saelens(tmp_path / "sae", layer=1, seed=8))},
    ).json()["id"]
    assert api(server, "POST", f"/api/saes/{sae}/attach").status_code == 200
    assert api(server, "GET", "/api/models").json()["locked"] == MODEL and listed(server) == [MODEL]
    error(chat(server, GEMMA), 409, "model_locked")
    refused = error(api(server, "POST", f"/api/models/{MODEL}/unlock"), 409, "sae_attached")
    assert sae in refused["message"]
    # Unloading the locked model detaches its SAEs but keeps the attachment and the lock: a
    # request naming it reloads it and steering is back.
    assert api(server, "POST", f"/api/models/{MODEL}/unload").json()["was_loaded"] is True
    assert api(server, "GET", f"/api/saes/{sae}").json()["attached"] is False
    error(chat(server, GEMMA), 409, "model_locked")
    assert chat(server, MODEL).status_code == 200
    assert api(server, "GET", f"/api/saes/{sae}").json()["attached_layer"] == 1
    assert api(server, "POST", f"/api/saes/{sae}/detach").status_code == 200
    assert api(server, "POST", f"/api/models/{MODEL}/unlock").json()["was_locked"] is True
    assert listed(server) == [MODEL, GEMMA]


def test_registrations_and_the_lock_survive_a_restart(tiny_dirs, tmp_path):
    home = tmp_path / "home"
    first = ServerProcess(home, ["--model", str(tiny_dirs["llama"])]).wait_ready()
    try:
        assert (
            api(first, "POST", "/api/models", json={"source": str(tiny_dirs["gemma2"])}).status_code
            == 201
        )
        assert api(first, "POST", f"/api/models/{MODEL}/lock").status_code == 200
        created = api(first, "GET", f"/api/models/{GEMMA}").json()["created"]
    finally:
        first.stop()
    second = ServerProcess(home, ["--model", str(tiny_dirs["llama"])]).wait_ready()
    try:
        body = api(second, "GET", "/api/models").json()
        assert body["locked"] == MODEL
        assert [(m["id"], m["state"]) for m in body["data"]] == [
            (MODEL, "loaded"),
            (GEMMA, "ready"),
        ]
        assert api(second, "GET", f"/api/models/{GEMMA}").json()["created"] == created
        error(chat(second, GEMMA), 409, "model_locked")
        assert api(second, "POST", f"/api/models/{MODEL}/unlock").status_code == 200
        assert chat(second, GEMMA).status_code == 200
    finally:
        second.stop()
