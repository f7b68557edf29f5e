"""Who may call which route: the API and admin keys, and no state changes from other sites' pages.

Routes fall in four classes (`route_class`): health probes and the schema are open; `/v1` is
inference, and so are the `/api` POSTs that only read the model (inspect, contrast, compare) and
Ember's routes (`/api/inference/v1/`); `/api` read with GET/HEAD/OPTIONS; every other `/api`
method changes state (admin), and so does any method on `/mcp`, whose tools steer.

| route class | keys accepted                                  | with no key configured |
|-------------|------------------------------------------------|------------------------|
| inference   | the API key, the admin key                     | open (no MILLM_API_KEY) |
| read        | either configured key                          | open (no key at all)   |
| admin       | the admin key only                             | open (no MILLM_ADMIN_KEY) |

State-changing routes also refuse requests a browser marks as coming from another page's
site (`Sec-Fetch-Site`) or origin (`Origin`), keys or not: a form or a `fetch` with no body on
any web page must not be able to steer a server on localhost.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import SecretStr

from millm.errors import CrossSiteRequest, InvalidAPIKey
from millm.v1.http.errors import error_response

OPEN, INFERENCE, READ, ADMIN = "open", "inference", "read", "admin"
OPEN_PATHS = frozenset({"/api/health", "/api/health/ready"})
MCP_PATH = "/mcp"  # where app.py mounts the MCP server (server/mcp_server.py)
# POST routes under /api that read the model without changing any state (discovery reads and
# side-by-side generation): inference, like /v1, so the API key opens them.
INFERENCE_POSTS = re.compile(r"^/api/(saes/[^/]+/(inspect|contrast)|compare|lens|attribution)$")
# Goodfire Ember's routes (lab/ember/): every one reads the model and changes nothing stored.
EMBER_PREFIX = "/api/inference/v1/"
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# vLLM's tokenizer routes (v1/tokenizer/routes.py) read the model as /v1 does.
TOKENIZER_PATHS = frozenset({"/tokenize", "/detokenize", "/tokenizer_info"})
# Sec-Fetch-Site values of requests a page on this server itself (or no page: a typed URL) makes.
OWN_SITE = frozenset({"same-origin", "none"})


def route_class(method: str, path: str) -> str:
    """open, inference, read or admin for this method and path."""
    if path in OPEN_PATHS:
        return OPEN
    if path == "/v1" or path.startswith("/v1/") or path in TOKENIZER_PATHS:
        return INFERENCE
    if path == MCP_PATH or path.startswith(MCP_PATH + "/"):
        return (
            ADMIN  # one endpoint for every tool, reads and steering alike: the key of the strongest
        )
    if path.startswith(EMBER_PREFIX):
        return INFERENCE
    if path == "/api" or path.startswith("/api/"):
        if method.upper() == "POST" and INFERENCE_POSTS.match(path):
            return INFERENCE
        return READ if method.upper() in READ_METHODS else ADMIN
    return OPEN  # the OpenAPI schema, its browser page, and unknown paths (404 for everyone)


def _digest(value: str) -> bytes:
    # Comparing fixed-length digests keeps the time independent of the keys' lengths and contents.
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


@dataclass(frozen=True)
class Keys:
    """The configured keys, kept as digests only."""

    api: bytes | None
    admin: bytes | None

    @classmethod
    def of(cls, api_key: SecretStr | None, admin_key: SecretStr | None) -> Keys:
        """Digests of the settings' keys (None where unset)."""
        return cls(
            _digest(api_key.get_secret_value()) if api_key is not None else None,
            _digest(admin_key.get_secret_value()) if admin_key is not None else None,
        )

    def accepted(self, kind: str) -> dict[str, bytes]:
        """The keys that open a route class (empty: the class is open)."""
        configured = {
            name: key for name, key in (("api", self.api), ("admin", self.admin)) if key is not None
        }
        if kind == INFERENCE:
            return configured if self.api is not None else {}
        if kind == ADMIN:
            return {"admin": self.admin} if self.admin is not None else {}
        if kind == READ:
            return configured
        return {}

    def match(self, presented: str) -> str | None:
        """Which configured key (api, admin) `presented` is, compared in constant time; None if
        neither."""
        digest = _digest(presented)
        found = None
        for name, key in (("api", self.api), ("admin", self.admin)):
            if key is not None and hmac.compare_digest(
                digest, key
            ):  # no early exit: both are always compared
                found = name
        return found


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def check_key(keys: Keys, kind: str, authorization: str | None) -> None:
    """Nothing if the request may use a route of this class; else 401 invalid_api_key (never
    echoing the key)."""
    accepted = keys.accepted(kind)
    if not accepted:
        return
    needed = "the admin key (MILLM_ADMIN_KEY)" if kind == ADMIN else "an API key"
    token = bearer(authorization)
    if token is None:
        raise InvalidAPIKey(f"This route needs {needed}: send it as 'Authorization: Bearer <key>'.")
    which = keys.match(token)
    if which is None:
        raise InvalidAPIKey("Incorrect API key provided.")
    if which not in accepted:
        raise InvalidAPIKey(
            "This route changes server state and needs the admin key (MILLM_ADMIN_KEY); the API "
            "key does not open it."
        )


def _host(netloc: str) -> str:
    return netloc.strip().lower().rstrip(".")


def check_same_site(headers: dict[str, str]) -> None:
    """403 cross_site_request when a browser says the request comes from another site's or
    origin's page."""
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site.strip().lower() not in OWN_SITE:
        raise CrossSiteRequest(
            "this route changes server state and refuses requests from other sites' pages "
            f"(Sec-Fetch-Site: {fetch_site})"
        )
    origin = headers.get("origin")
    if origin is None:
        return  # not a browser, or a browser that sent Sec-Fetch-Site: same-origin/none above
    own = {_host(headers.get("host", ""))} | {
        _host(h) for h in headers.get("x-forwarded-host", "").split(",") if h.strip()
    }
    if origin.strip().lower() == "null" or _host(urlsplit(origin.strip()).netloc) not in own:
        raise CrossSiteRequest(
            "this route changes server state and refuses requests from pages of another origin "
            f"({origin})"
        )


class AccessGuard:
    """Pure ASGI: refuses (401/403, OpenAI's error shape) before the body is read or the model is
    touched."""

    def __init__(self, app, keys: Keys):
        self.app, self.keys = app, keys

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        kind = route_class(scope["method"], scope["path"])
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope["headers"]
        }
        try:
            check_key(self.keys, kind, headers.get("authorization"))
            if kind == ADMIN:
                check_same_site(headers)
        except (InvalidAPIKey, CrossSiteRequest) as refusal:
            response = error_response(refusal)
            if isinstance(refusal, InvalidAPIKey):
                response.headers["WWW-Authenticate"] = 'Bearer realm="millm"'
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def is_loopback(host: str) -> bool:
    """Whether a listen address only accepts connections from this machine."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to any interface


def open_routes_warning(
    host: str, api_key: SecretStr | None, admin_key: SecretStr | None
) -> str | None:
    """The start-up warning for a server reachable from other machines with routes open to
    anyone."""
    if is_loopback(host):
        return None
    open_parts = []
    if api_key is None:
        open_parts.append("/v1 (no MILLM_API_KEY)")
    if admin_key is None:
        open_parts.append("every state-changing /api route and /mcp (no MILLM_ADMIN_KEY)")
    if not open_parts:
        return None
    return (
        f"listening on {host}, reachable from other machines, with {' and '.join(open_parts)} "
        "open to anyone who can reach the port; set the keys (see docs/serving.md, Access control)"
    )
