"""Access control on a live server: API and admin keys through the OpenAI SDK and raw HTTP, no state
changes from other sites' pages, paths confined to the allowed folders, bodies capped before
reading."""

import shutil
import socket

import httpx
import openai
import pytest

from tests.api.clients import MODEL, api, error
from tests.support.mistudio_docs import cluster, raw
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

API_KEY = "sk-test-api-7f3a9c21"
ADMIN_KEY = "sk-test-admin-91b2e4d0"
WRONG_KEY = "sk-wrong-guess-5555"
REQUEST_CAP, IMPORT_CAP = 65536, 131072
USER = [{"role": "user", "content": "Say something."}]


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keyed(tiny_dirs, tmp_path_factory):
    """A server with both keys (the admin key from a file) that reads only its data directory and
    --model."""
    secrets = tmp_path_factory.mktemp("secrets")
    (secrets / "admin-key").write_text(ADMIN_KEY + "\n")
    env = {
        "MILLM_API_KEY": API_KEY,
        "MILLM_ADMIN_KEY_FILE": str(secrets / "admin-key"),
        "MAX_REQUEST_BYTES": str(REQUEST_CAP),
        "MAX_IMPORT_BYTES": str(IMPORT_CAP),
    }
    process = ServerProcess(
        tmp_path_factory.mktemp("keyed-home"),
        ["--model", str(tiny_dirs["llama"])],
        env=env,
        allowed=[],
    )
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def client(server, key):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0, timeout=60)


def test_the_sdk_needs_the_api_key(keyed):
    for key in (WRONG_KEY, "not-needed"):
        with pytest.raises(openai.AuthenticationError) as refused:
            client(keyed, key).chat.completions.create(model=MODEL, messages=USER, max_tokens=4)
        assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    for key in (API_KEY, ADMIN_KEY):  # the admin key also opens /v1
        reply = client(keyed, key).chat.completions.create(
            model=MODEL, messages=USER, max_tokens=4, temperature=0
        )
        assert reply.choices[0].finish_reason in ("stop", "length")
    assert [m.id for m in client(keyed, API_KEY).models.list().data] == [MODEL]
    missing = httpx.post(
        f"{keyed.base_url}/v1/chat/completions", json={"model": MODEL, "messages": USER}, timeout=60
    )
    body = error(missing, 401, "invalid_api_key", "invalid_request_error")
    assert "Authorization: Bearer" in body["message"] and body["param"] is None
    assert missing.headers["www-authenticate"].startswith("Bearer")


def test_admin_routes_take_only_the_admin_key(keyed):
    refused = error(
        api(keyed, "POST", "/api/steering/disable", headers=bearer(API_KEY)), 401, "invalid_api_key"
    )
    assert "needs the admin key" in refused["message"]
    error(api(keyed, "POST", "/api/steering/disable"), 401, "invalid_api_key")
    error(
        api(
            keyed,
            "POST",
            "/api/profiles",
            headers=bearer(WRONG_KEY),
            json={"name": "x", "steering": []},
        ),
        401,
        "invalid_api_key",
    )
    # nothing changed
    assert api(keyed, "GET", "/api/steering", headers=bearer(API_KEY)).json()["enabled"] is True
    assert api(keyed, "GET", "/api/profiles", headers=bearer(API_KEY)).json()["data"] == []
    assert api(keyed, "POST", "/api/steering/disable", headers=bearer(ADMIN_KEY)).status_code == 200
    assert api(keyed, "GET", "/api/steering", headers=bearer(ADMIN_KEY)).json()["enabled"] is False
    assert api(keyed, "POST", "/api/steering/enable", headers=bearer(ADMIN_KEY)).status_code == 200


def test_reads_take_either_key_and_health_stays_open(keyed):
    for path in ("/api/steering", "/api/models", "/api/health/inference", "/api/monitoring"):
        error(api(keyed, "GET", path), 401, "invalid_api_key")
        assert api(keyed, "GET", path, headers=bearer(API_KEY)).status_code == 200
        assert api(keyed, "GET", path, headers=bearer(ADMIN_KEY)).status_code == 200
    for path in ("/api/health", "/api/health/ready", "/openapi.json"):
        assert api(keyed, "GET", path).status_code == 200


def test_keys_never_reach_the_log(keyed):
    client(keyed, API_KEY).chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
    api(keyed, "POST", "/api/steering/enable", headers=bearer(WRONG_KEY))
    api(keyed, "GET", "/api/steering", headers=bearer(ADMIN_KEY))
    log = keyed.log
    assert API_KEY not in log and ADMIN_KEY not in log and WRONG_KEY not in log


def test_no_state_changes_from_other_sites_pages(keyed, llama_server):
    # What a page on another site can send without a preflight: a body-less POST, or a form.
    for server, auth in ((llama_server, {}), (keyed, bearer(ADMIN_KEY))):
        for browser in (
            {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
            # another port on localhost: same site, other origin
            {"Origin": "http://localhost:3000"},
            {"Sec-Fetch-Site": "same-site"},
        ):
            body = error(
                api(server, "POST", "/api/steering/disable", headers={**auth, **browser}),
                403,
                "cross_site_request",
            )
            assert "other sites" in body["message"] or "another origin" in body["message"]
        form = api(
            server,
            "POST",
            "/api/profiles/import",
            headers={**auth, "Origin": "null", "Content-Type": "text/plain"},
            content=b'{"name": "x"}',
        )
        error(form, 403, "cross_site_request")
        assert api(server, "GET", "/api/steering", headers=auth).json()["enabled"] is True
        # The same origin (a page millm serves itself) and clients that are not browsers pass.
        own = {"Origin": server.base_url, "Sec-Fetch-Site": "same-origin"}
        assert (
            api(server, "POST", "/api/steering/enable", headers={**auth, **own}).status_code == 200
        )
        # Reads and /v1 do not change state: a page may still be refused by the browser, not by us.
        assert (
            api(
                server, "GET", "/api/steering", headers={**auth, "Origin": "http://evil.example"}
            ).status_code
            == 200
        )


def test_a_server_on_every_interface_warns_about_open_routes(tiny_dirs, tmp_path, keyed):
    server = ServerProcess(
        tmp_path / "home",
        ["--model", str(tiny_dirs["llama"]), "--host", "0.0.0.0"],
        env={"MILLM_API_KEY": API_KEY},
    )
    try:
        server.wait_ready()
        warnings = [line for line in server.log.splitlines() if "open to anyone" in line]
        assert len(warnings) == 1 and "WARNING" in warnings[0]
        assert "state-changing /api" in warnings[0] and "/v1 (no MILLM_API_KEY)" not in warnings[0]
    finally:
        server.stop()
    assert "open to anyone" not in keyed.log  # loopback with both keys: nothing to warn about


# Paths --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """An SAE the keyed server may not read: outside its data directory (it has no
    MILLM_ALLOWED_PATHS)."""
    return build_saelens(tmp_path_factory.mktemp("outside-saes") / "sae", layer=1, seed=77)


def register_sae(server, **body):
    return api(server, "POST", "/api/saes", headers=bearer(ADMIN_KEY), json=body)


def test_paths_outside_the_allowed_folders_are_refused_alike(keyed, outside, tmp_path_factory):
    home = keyed.log_path.parent
    refusals = {}
    for name, path in {
        "sae": outside,
        "missing": outside.parent / "no-such-sae",
        "passwd": "/etc/passwd",
        "environ": "/proc/self/environ",  # would hold the keys
        "dotdot": f"{home}/../{outside.parent.name}/sae",
    }.items():
        body = error(
            register_sae(keyed, path=str(path)), 403, "path_not_allowed", "invalid_request_error"
        )
        assert body["param"] == "path"
        refusals[name] = body["message"].replace(str(path), "<path>")
    assert len(set(refusals.values())) == 1, refusals  # nothing tells whether the path exists
    link = home / "linked-sae"
    link.symlink_to(outside, target_is_directory=True)
    # a link inside leads outside
    error(register_sae(keyed, path=str(link)), 403, "path_not_allowed")
    shutil.copytree(outside, home / "saes" / "copied")
    # the data directory is readable
    assert register_sae(keyed, path=str(home / "saes" / "copied")).status_code == 201
    assert (
        api(keyed, "GET", "/api/saes", headers=bearer(API_KEY))
        .json()["data"][0]["path"]
        .startswith(str(home))
    )


def test_hub_references_may_not_climb(keyed):
    error(register_sae(keyed, repo="acme/saes", path="../../../etc"), 403, "path_not_allowed")
    error(register_sae(keyed, repo="acme/saes", path="/etc"), 403, "path_not_allowed")
    error(
        register_sae(keyed, repo="acme/saes", path="layer_1", revision="../../x"),
        403,
        "path_not_allowed",
    )
    error(register_sae(keyed, repo="acme/.."), 400)
    # allowed, just not reachable here
    offline = error(register_sae(keyed, repo="acme/saes", path="layer_1/width_16k"), 400)
    assert "acme/saes" in offline["message"]


def test_model_sources_are_confined_too(keyed, tiny_dirs):
    def register(source):
        return api(keyed, "POST", "/api/models", headers=bearer(ADMIN_KEY), json={"source": source})

    body = error(register(str(tiny_dirs["gemma2"])), 403, "path_not_allowed")
    assert body["param"] == "source"
    error(register("/etc"), 403, "path_not_allowed")
    error(register(f"{tiny_dirs['llama']}/../{tiny_dirs['gemma2'].name}"), 403, "path_not_allowed")
    # --model is always allowed (registered already)
    assert register(str(tiny_dirs["llama"])).status_code == 200
    # a hub id: looked up, never on disk
    hub = error(register("acme/no-such-model"), 400, "invalid_model_source")
    assert "acme/no-such-model" in hub["message"]


# Body caps ----------------------------------------------------------------------------------------
def exchange(server, head: str, body: bytes, timeout: float = 10.0) -> tuple[int, bytes]:
    """Send a request head and part of a body on a raw socket; the status and whatever came back."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(head.encode() + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < 20:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1]), data


def test_bodies_are_capped_before_they_are_read(keyed):
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * REQUEST_CAP}]}
    body = error(
        api(keyed, "POST", "/v1/chat/completions", headers=bearer(API_KEY), json=big),
        413,
        "request_too_large",
    )
    assert "MAX_REQUEST_BYTES" in body["message"]
    # A declared 100 MB body: refused at once, after 20 bytes of it (the rest is never sent).
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
        f"{API_KEY}\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n"
    )
    status, answer = exchange(keyed, head, b'{"model": "tiny-llam')
    assert status == 413 and b"request_too_large" in answer
    # A chunked body: counted as it arrives, refused once past the cap (the last chunk never comes).
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
        f"{API_KEY}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"x" * (REQUEST_CAP + 10)
    status, answer = exchange(keyed, head, f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
    assert status == 413 and b"request_too_large" in answer


def test_imports_have_their_own_cap(keyed):
    def import_cluster(document: bytes):
        return api(
            keyed,
            "POST",
            "/api/clusters/import",
            headers={**bearer(ADMIN_KEY), "Content-Type": "application/json"},
            content=document,
        )

    padded = cluster(name="padded", extra={"x_padding": "p" * (REQUEST_CAP + 1000)})
    assert len(raw(padded)) > REQUEST_CAP
    # over the request cap, under the import cap
    assert import_cluster(raw(padded)).status_code == 201
    huge = cluster(name="huge", extra={"x_padding": "p" * IMPORT_CAP})
    body = error(import_cluster(raw(huge)), 413, "document_too_large")
    assert "MAX_IMPORT_BYTES" in body["message"]
    names = [
        c["name"]
        for c in api(keyed, "GET", "/api/clusters", headers=bearer(API_KEY)).json()["data"]
    ]
    assert names == ["padded"]
