"""Model leases through the API: a client's lease keeps the loaded model from being swapped away
by others, its id lifts that for its holder, and reads never show the id."""

import pytest

from tests.api.clients import MODEL, api, error
from tests.support.server import ServerProcess

OTHER = "tiny-llama-plain"
USER = [{"role": "user", "content": "hello"}]
HOLD = {"holder": "batch-runner", "reason": "scoring 50k rows"}


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    process = ServerProcess(
        tmp_path_factory.mktemp("lease-home"), ["--model", str(tiny_dirs["llama"])]
    )
    try:
        process.wait_ready()
        registered = api(
            process, "POST", "/api/models", json={"source": str(tiny_dirs["llama-plain"])}
        )
        assert registered.status_code == 201
        yield process
    finally:
        process.stop()


def chat(server, model: str, **headers):
    body = {"model": model, "messages": USER, "max_tokens": 2}
    return api(server, "POST", "/v1/chat/completions", json=body, headers=headers)


def test_a_lease_keeps_the_model_until_its_holder_swaps_it(server):
    for ttl in (0, 7201, "x"):
        refused = error(
            api(server, "POST", f"/api/models/{MODEL}/lease", json={**HOLD, "ttl_seconds": ttl}),
            400,
            "invalid_parameter",
        )
        assert refused["param"] == "ttl_seconds"
    error(api(server, "POST", f"/api/models/{OTHER}/lease", json=HOLD), 409, "model_not_resident")
    granted = api(server, "POST", f"/api/models/{MODEL}/lease", json={**HOLD, "ttl_seconds": 600})
    assert granted.status_code == 201, granted.text
    token = granted.json()["lease_id"]
    assert granted.json()["ttl_seconds"] == 600 and granted.json()["holder"] == "batch-runner"
    second = error(
        api(server, "POST", f"/api/models/{MODEL}/lease", json=HOLD), 409, "model_leased"
    )
    assert "leased by 'batch-runner'" in second["message"]
    # Reads say who holds it and why, never the id.
    read = api(server, "GET", f"/api/models/{MODEL}/lease").text
    listed = api(server, "GET", "/api/models").text
    assert token not in read and token not in listed and '"scoring 50k rows"' in read
    one = api(server, "GET", f"/api/models/{MODEL}").json()
    assert one["lease"]["holder"] == "batch-runner" and one["lease"]["seconds_remaining"] <= 600
    # Others may use the model, not swap it away.
    assert chat(server, MODEL).status_code == 200
    error(chat(server, OTHER), 409, "model_leased")
    error(api(server, "POST", f"/api/models/{OTHER}/load"), 409, "model_leased")
    error(api(server, "POST", f"/api/models/{MODEL}/unload"), 409, "model_leased")
    headers = {"X-miLLM-Lease": token}
    renewed = api(server, "POST", f"/api/models/{MODEL}/lease/renew", json={}, headers=headers)
    assert renewed.status_code == 200 and renewed.json()["ttl_seconds"] == 7200
    random = {"X-miLLM-Lease": "not-an-id"}
    missing = api(server, "POST", f"/api/models/{MODEL}/lease/renew", json={}, headers=random)
    error(missing, 404, "lease_not_found")
    # The holder's own swap goes ahead and ends the lease.
    assert chat(server, OTHER, **headers).status_code == 200
    ended = api(server, "GET", f"/api/models/{MODEL}/lease").json()
    assert ended["lease"] is None and ended["last_ended"]["end_reason"] == "model_unloaded"
    assert chat(server, MODEL).status_code == 200  # no lease: anyone may swap back


def test_a_released_lease_says_so(server):
    resident = next(
        m["id"] for m in api(server, "GET", "/api/models").json()["data"] if m["state"] == "loaded"
    )
    token = api(server, "POST", f"/api/models/{resident}/lease", json=HOLD).json()["lease_id"]
    headers = {"X-miLLM-Lease": token}
    released = api(server, "DELETE", f"/api/models/{resident}/lease", headers=headers)
    assert released.status_code == 200 and released.json()["end_reason"] == "released"
    late = api(server, "POST", f"/api/models/{resident}/lease/renew", json={}, headers=headers)
    error(late, 409, "lease_expired")
