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
#: Where the middleware leaves which key a request carried ("key 0", "key 1", ...), for per-key caps in handlers.
KEY_SCOPE_KEY = "frame.api_key"


def client_of(scope: Scope) -> str:
    """Who sent a request, for per-client caps: its API key when the server has keys, else its client address."""
    key = scope.get(KEY_SCOPE_KEY)
    if key is not None:
        return key
    client = scope.get("client")
    return f"address {client[0]}" if client else "address unknown"


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
    """Refuses (401, OpenAI shape) any request but OPEN_PATHS without a configured key; records its tenant.

    At most ``max_per_key`` requests of one key are in flight at once (each holds a connection until it ends); the
    next gets a 429 with ``Retry-After``, so one tenant cannot take every connection from the others."""

    def __init__(self, app: ASGIApp, api_keys: list[str], salt_by_key: bool, max_per_key: int = 512) -> None:
        self.app, self.max_per_key = app, max_per_key
        self.expected = [(f"Bearer {k}".encode(), tenant_salt(k) if salt_by_key else None) for k in api_keys]
        self.in_flight = [0] * len(api_keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given = headers.get(b"authorization", b"")
        anthropic = scope["path"].startswith(ANTHROPIC_PREFIX)
        if anthropic and not given and headers.get(b"x-api-key"):  # how the anthropic SDK sends its key
            given = b"Bearer " + headers[b"x-api-key"]
        found: list[int] = []
        for index, (expected, _) in enumerate(self.expected):  # every key is compared: timing says not which
            if hmac.compare_digest(given, expected):
                found.append(index)
        if not found:
            why = "No API key was sent" if not given else "The API key is wrong"
            bearer = "'Authorization: Bearer <key>'"
            how = f"'x-api-key: <key>' or {bearer}" if anthropic else bearer
            await _refuse(send, scope["path"], 401, f"{why}; send {how}.", "invalid_api_key",
                          (b"www-authenticate", b"Bearer"))
            return
        index = found[0]
        if self.in_flight[index] >= self.max_per_key:
            await _refuse(send, scope["path"], 429, f"This API key has {self.in_flight[index]} requests in flight, "
                          "the server's limit per key (--max-connections-per-key); retry when some have finished.",
                          "too_many_requests", (b"retry-after", b"1"))
            return
        scope[TENANT_SCOPE_KEY] = self.expected[index][1]
        scope[KEY_SCOPE_KEY] = f"key {index}"
        self.in_flight[index] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight[index] -= 1


async def _refuse(send: Send, path: str, status: int, message: str, code: str, header: tuple[bytes, bytes]) -> None:
    body = json.dumps(shaped(path, error_body(message, status, code))).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), header]})
    await send({"type": "http.response.body", "body": body})
