"""Access rules as tables: route classes, which key opens which class, same-site checks, the
start-up warning."""

import pytest
from pydantic import SecretStr

from millm.errors import BatchFileLimit
from millm.server.access import (
    ADMIN,
    INFERENCE,
    OPEN,
    READ,
    CrossSiteRequest,
    InvalidAPIKey,
    Keys,
    bearer,
    check_key,
    check_same_site,
    open_routes_warning,
    route_class,
)
from millm.server.body_limit import DocumentTooLarge, RequestTooLarge, body_cap
from millm.settings import key_setting


@pytest.mark.parametrize(
    "method, path, kind",
    [
        ("GET", "/api/health", OPEN),
        ("GET", "/api/health/ready", OPEN),
        ("GET", "/api/health/inference", READ),
        ("GET", "/openapi.json", OPEN),
        ("GET", "/docs", OPEN),
        ("POST", "/v1/chat/completions", INFERENCE),
        ("GET", "/v1/models", INFERENCE),
        ("GET", "/api/steering", READ),
        ("HEAD", "/api/profiles", READ),
        ("GET", "/api/monitoring/stream", READ),
        ("PUT", "/api/steering/saes/s/features/1", ADMIN),
        ("POST", "/api/steering/disable", ADMIN),
        ("DELETE", "/api/profiles/x", ADMIN),
        ("PATCH", "/api/anything", ADMIN),
        ("POST", "/api/models/m/load", ADMIN),
        ("POST", "/api/health", OPEN),
        ("GET", "/v1x", OPEN),
        ("POST", "/api/saes/sae_1/inspect", INFERENCE),
        ("POST", "/api/saes/sae_1/contrast", INFERENCE),
        ("POST", "/api/compare", INFERENCE),
        ("POST", "/api/inference/v1/chat/completions", INFERENCE),  # Goodfire Ember's routes
        ("GET", "/api/inference/v1/features/search", INFERENCE),
        ("POST", "/api/inference/v1/features/auto-edits", INFERENCE),
        ("POST", "/api/saes/sae_1/calibrate", ADMIN),
        ("GET", "/api/probes", READ),
        ("POST", "/api/probes/train", ADMIN),
        ("POST", "/api/probes/p/activate", ADMIN),
        ("POST", "/api/saes/sae_1/inspect/x", ADMIN),
        ("DELETE", "/api/compare", ADMIN),
        ("DELETE", "/api/jobs/job_1", ADMIN),
        ("POST", "/mcp", ADMIN),  # every tool, reads included: one endpoint, the strongest key
        ("GET", "/mcp", ADMIN),
        ("DELETE", "/mcp/", ADMIN),
        ("POST", "/mcpx", OPEN),
    ],
)
def test_route_classes(method, path, kind):
    assert route_class(method, path) == kind


API, ADMIN_KEY = "sk-api-0123456789", "sk-admin-0123456789"
BOTH = Keys.of(SecretStr(API), SecretStr(ADMIN_KEY))
API_ONLY = Keys.of(SecretStr(API), None)
ADMIN_ONLY = Keys.of(None, SecretStr(ADMIN_KEY))
NONE = Keys.of(None, None)


@pytest.mark.parametrize(
    "keys, kind, sent, allowed",
    [
        (NONE, INFERENCE, None, True),
        (NONE, ADMIN, None, True),
        (NONE, READ, None, True),
        (BOTH, INFERENCE, API, True),
        (BOTH, INFERENCE, ADMIN_KEY, True),  # the admin key also opens /v1
        (BOTH, INFERENCE, None, False),
        (BOTH, INFERENCE, "sk-wrong", False),
        (BOTH, ADMIN, ADMIN_KEY, True),
        (BOTH, ADMIN, API, False),  # the API key never opens admin routes
        (BOTH, READ, API, True),
        (BOTH, READ, ADMIN_KEY, True),
        (BOTH, READ, None, False),
        (BOTH, OPEN, None, True),
        (API_ONLY, INFERENCE, API, True),
        (
            API_ONLY,
            ADMIN,
            None,
            True,
        ),  # no admin key: state-changing routes stay open (and start-up warns)
        (API_ONLY, READ, None, False),
        (ADMIN_ONLY, INFERENCE, None, True),
        (ADMIN_ONLY, ADMIN, None, False),
        (ADMIN_ONLY, READ, ADMIN_KEY, True),
    ],
)
def test_which_key_opens_which_class(keys, kind, sent, allowed):
    header = f"Bearer {sent}" if sent else None
    if allowed:
        check_key(keys, kind, header)
    else:
        with pytest.raises(InvalidAPIKey) as refused:
            check_key(keys, kind, header)
        assert refused.value.status == 401 and refused.value.code == "invalid_api_key"
        assert (sent or "") not in refused.value.message or not sent  # the key is never echoed


def test_the_api_key_at_an_admin_route_is_told_what_it_needs():
    with pytest.raises(InvalidAPIKey, match="needs the admin key"):
        check_key(BOTH, ADMIN, f"Bearer {API}")


@pytest.mark.parametrize(
    "header, token",
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("BEARER abc", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_tokens(header, token):
    assert bearer(header) == token


@pytest.mark.parametrize(
    "headers, allowed",
    [
        ({}, True),  # curl, the SDK: no browser headers
        ({"host": "127.0.0.1:8000"}, True),
        (
            {
                "sec-fetch-site": "same-origin",
                "origin": "http://127.0.0.1:8000",
                "host": "127.0.0.1:8000",
            },
            True,
        ),
        ({"sec-fetch-site": "none"}, True),
        ({"sec-fetch-site": "cross-site"}, False),
        ({"sec-fetch-site": "same-site"}, False),  # another port on localhost is the same site
        ({"origin": "http://evil.example", "host": "127.0.0.1:8000"}, False),
        ({"origin": "null", "host": "127.0.0.1:8000"}, False),
        ({"origin": "http://localhost:3000", "host": "localhost:8000"}, False),
        (
            {"origin": "https://millm.example.org", "host": "millm.example.org"},
            True,
        ),  # behind a TLS proxy
        (
            {
                "origin": "https://millm.example.org",
                "host": "10.0.0.5:8000",
                "x-forwarded-host": "millm.example.org",
            },
            True,
        ),
    ],
)
def test_same_site_checks(headers, allowed):
    if allowed:
        check_same_site(headers)
    else:
        with pytest.raises(CrossSiteRequest):
            check_same_site(headers)


@pytest.mark.parametrize(
    "host, api, admin, warns",
    [
        ("127.0.0.1", None, None, False),
        ("localhost", None, None, False),
        ("::1", None, None, False),
        ("0.0.0.0", None, None, True),
        ("0.0.0.0", "k1", None, True),
        ("0.0.0.0", "k1", "k2", False),
        ("192.168.1.4", None, "k2", True),
    ],
)
def test_start_up_warning(host, api, admin, warns):
    warning = open_routes_warning(
        host, SecretStr(api) if api else None, SecretStr(admin) if admin else None
    )
    assert (warning is not None) == warns
    if warning:
        assert ("/v1" in warning) == (api is None) and ("state-changing" in warning) == (
            admin is None
        )


def test_keys_from_files(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file-123\n")
    assert key_setting(None, key_file, "MILLM_API_KEY").get_secret_value() == "sk-from-file-123"
    with pytest.raises(ValueError, match="not both"):
        key_setting(SecretStr("x"), key_file, "MILLM_API_KEY")
    with pytest.raises(ValueError, match="cannot be read"):
        key_setting(None, tmp_path / "missing", "MILLM_API_KEY")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="non-empty"):
        key_setting(None, tmp_path / "empty", "MILLM_API_KEY")
    with pytest.raises(ValueError, match="non-empty"):
        key_setting(SecretStr("two words"), None, "MILLM_ADMIN_KEY")


def test_body_caps_by_route():
    assert body_cap("/v1/chat/completions", 100, 50) == (100, RequestTooLarge, "MAX_REQUEST_BYTES")
    assert body_cap("/api/clusters/import", 100, 50) == (50, DocumentTooLarge, "MAX_IMPORT_BYTES")
    assert body_cap("/api/profiles/import", 100, 500)[0] == 500
    # A batch file's own cap, its multipart framing beside it, refused as the upload would be.
    assert body_cap("/v1/files", 100, 50, 10_000) == (
        10_000 + 65_536,
        BatchFileLimit,
        "MILLM_BATCH_MAX_FILE_BYTES",
    )
    assert body_cap("/api/probes/import", 100, 500)[0] == 500
    assert body_cap("/api/saes/sae_0123456789ab/labels", 100, 50) == (
        50,
        DocumentTooLarge,
        "MAX_IMPORT_BYTES",
    )
    assert body_cap("/api/saes/sae_0123456789ab/features", 100, 50)[0] == 100
