"""RequestGuard: the outermost middleware of the app, before routing and before the API key is checked.

- A body over ``max_body_bytes`` is a 413: at once when ``Content-Length`` says so, or as soon as the bytes
  read pass the limit, so an oversized body is never held in memory.
- A body must arrive within ``body_timeout_s`` once the app starts reading it (408), so a client cannot hold a
  request open by trickling its body.
- A response sent before its request's body was read, any 5xx, and every response while the server drains
  carry ``Connection: close``: the client knows the connection ends there instead of reusing it and meeting a
  reset.
- Every 503 carries ``Retry-After`` (the handlers set it; a 503 that arrives here without one, such as a dead
  engine's answer to a request in flight, gets ``retry_after_s``).
- An unexpected exception is a 500 in the OpenAI shape (logged here, with its traceback), never a bare reset.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from frame.server.errors import error_body, shaped

log = logging.getLogger("frame.server")
CLOSE = (b"connection", b"close")


def _declared_length(scope: Scope) -> tuple[int | None, bool]:
    """``(Content-Length or None, whether a body follows)``; h11 has already refused malformed values."""
    headers = dict(scope["headers"])
    if b"content-length" in headers:
        length = int(headers[b"content-length"])
        return length, length > 0
    return None, b"transfer-encoding" in headers


async def send_error(send: Send, status: int, message: str, code: str, *, close: bool = True,
                     path: str = "") -> None:
    """Send a whole error response in the OpenAI shape (Anthropic's for the Messages API's ``path``)."""
    body = json.dumps(shaped(path, error_body(message, status, code))).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*headers, CLOSE] if close else headers})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """Body size and time limits, ``Connection: close`` where a connection cannot go on, and a JSON 500."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout_s: float,
                 draining: Callable[[], bool], retry_after_s: int = 1) -> None:
        self.app, self.draining, self.retry_after = app, draining, str(retry_after_s).encode()
        self.max_body_bytes, self.body_timeout_s = max_body_bytes, body_timeout_s

    def _too_large(self, size: int | str) -> str:
        return (f"The request body is {size} bytes, over this server's limit of {self.max_body_bytes} "
                "(--max-body-bytes); send a smaller request.")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared, has_body = _declared_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await send_error(send, 413, self._too_large(declared), "request_too_large", path=scope["path"])
            return
        loop = asyncio.get_running_loop()
        body_done, received, deadline, started = not has_body, 0, None, False

        async def guarded_receive() -> Message:
            nonlocal body_done, received, deadline
            if body_done:
                return await receive()
            deadline = deadline or loop.time() + self.body_timeout_s
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except asyncio.TimeoutError:
                raise HTTPException(408, f"The request body did not arrive within this server's limit of "
                                         f"{self.body_timeout_s:g} s (--body-timeout).",
                                    headers={"Connection": "close"}) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise HTTPException(413, self._too_large(f"over {self.max_body_bytes}"),
                                        headers={"Connection": "close"})
                body_done = not message.get("more_body", False)
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                if message["status"] == 503 and not any(h[0].lower() == b"retry-after" for h in headers):
                    headers.append((b"retry-after", self.retry_after))
                if not body_done or message["status"] >= 500 or self.draining():
                    headers = [*(h for h in headers if h[0].lower() != b"connection"), CLOSE]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except Exception:
            log.exception("unhandled error answering %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await send_error(guarded_send, 500, "The server failed to answer this request; retry it.",
                                 "internal_error", path=scope["path"])
