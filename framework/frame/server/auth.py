"""API keys: every route but ``/health`` needs ``Authorization: Bearer <key>`` (the Messages API's routes also take
Anthropic's ``x-api-key: <key>``); each key may be its own tenant.

With several keys (or ``--cache-salt-from api-key``), a request's prefix-cache entries are salted with a digest
of its key, so one tenant never hits another's cached prefix (a hit shows in ``cached_tokens`` and in time to
first token, which would let one tenant probe another's prompts).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from frame.errors import ConfigError
from frame.server.errors import ANTHROPIC_PREFIX, error_body, shaped

#: Paths served without an API key.
OPEN_PATHS = frozenset({"/health"})
#: Where the middleware leaves the tenant's cache salt for the handlers (None: no salt from the key).
TENANT_SCOPE_KEY = "frame.tenant_salt"


def tenant_salt(key: str) -> str:
    """The cache salt of requests made with ``key``: a digest, so the key itself never reaches the engine."""
    return hashlib.sha256(b"frame-tenant\0" + key.encode()).hexdigest()[:32]


def effective_salt(request_salt: str | None, tenant: str | None) -> str | None:
    """The salt a request's sequences carry: the tenant's digest, then the request's own salt within it."""
    if tenant is None:
        return request_salt
    return tenant if request_salt is None else f"{tenant}/{request_salt}"


def read_key_file(path: str) -> list[str]:
    """Keys from a file, one a line; blank lines and ``#`` comments are skipped."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--api-key-file {path} cannot be read: {err.__class__.__name__}.",
                          param="api_key_file") from None
    keys = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise ConfigError(f"--api-key-file {path} holds no key; write one key a line.", param="api_key_file")
    return keys


def check_keys(keys: list[str]) -> None:
    for key in keys:
        if not key.isascii() or not key.isprintable() or " " in key:
            raise ConfigError("An API key must be printable ASCII without spaces (it travels in an HTTP header).",
                              param="api_key")


class ApiKeyMiddleware:
    """Refuses (401, OpenAI shape) any request but OPEN_PATHS without a configured key; records its tenant."""

    def __init__(self, app: ASGIApp, api_keys: list[str], salt_by_key: bool) -> None:
        self.app = app
        self.expected = [(f"Bearer {k}".encode(), tenant_salt(k) if salt_by_key else None) for k in api_keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given = headers.get(b"authorization", b"")
        anthropic = scope["path"].startswith(ANTHROPIC_PREFIX)
        if anthropic and not given and headers.get(b"x-api-key"):  # how the anthropic SDK sends its key
            given = b"Bearer " + headers[b"x-api-key"]
        found: list[str | None] = []
        for expected, salt in self.expected:  # every key is compared, so timing says nothing about which matched
            if hmac.compare_digest(given, expected):
                found.append(salt)
        if found:
            scope[TENANT_SCOPE_KEY] = found[0]
            await self.app(scope, receive, send)
            return
        why = "No API key was sent" if not given else "The API key is wrong"
        how = "'x-api-key: <key>' or 'Authorization: Bearer <key>'" if anthropic else "'Authorization: Bearer <key>'"
        body = json.dumps(shaped(scope["path"], error_body(f"{why}; send {how}.", 401, "invalid_api_key"))).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
