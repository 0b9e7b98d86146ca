"""GuardedH11Protocol: uvicorn's h11 protocol with the connection limits uvicorn lacks.

- **Header timeout.** A connection must deliver a request's complete headers within ``header_timeout_s`` of
  connecting (or of the first byte of a later request on a kept-alive connection), else it is closed. uvicorn
  only times out idle kept-alive connections, so a client that sends half a request line holds its socket and
  file descriptor forever (thousands of them exhaust the process's descriptors, before any API key is checked).
- **Connection cap.** Past ``max_connections`` open connections, a new one gets a 503 in the OpenAI shape and is
  closed at once.
- **Lingering close.** When the server closes a connection whose client is still sending a body (a 413, a 401
  before the body was read), it first shuts down its sending side and reads and discards what still arrives, for
  at most ``linger_s``: closing a socket with unread bytes sends a reset, which can destroy the answer in the
  client's buffers before it reads it.

uvicorn builds protocols itself, so the limits are class attributes: :func:`protocol_class` makes a subclass
carrying them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from frame.server.errors import error_body
from frame.server.settings import HttpLimits

log = logging.getLogger("frame.server")
#: Seconds a closing connection keeps reading what its client still sends.
LINGER_S = 2.0


def _overloaded_response(limit: int) -> bytes:
    body = json.dumps(error_body(f"The server has {limit} open connections, its limit (--max-connections); "
                                 "retry shortly.", 503, "too_many_connections")).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "retry-after: 1\r\nconnection: close\r\n\r\n")
    return head.encode() + body


class _LingeringTransport:
    """The real transport, except that ``close`` asks the protocol, which may linger first."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedH11Protocol) -> None:
        self._transport, self._protocol = transport, protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._protocol.close_transport()


class GuardedH11Protocol(H11Protocol):
    """The h11 protocol with a header timeout, a connection cap and a lingering close."""

    header_timeout_s: float = 10.0
    max_connections: int = 1024
    linger_s: float = LINGER_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._real = transport
        self._header_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._lingering = False
        super().connection_made(_LingeringTransport(transport, self))  # type: ignore[arg-type]
        if len(self.connections) > self.max_connections:
            log.warning("refusing a connection: %d open, the limit is %d", len(self.connections) - 1,
                        self.max_connections)
            transport.write(_overloaded_response(self.max_connections))
            transport.close()
            return
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the answer is sent; what the client still sends is read and dropped
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:
            self._cancel(self._header_timer)  # a new request's headers are complete
            self._header_timer = None
        elif cycle is None or cycle.response_complete:
            self._arm_header_timer()  # part of the next request's headers

    def eof_received(self) -> bool | None:
        if self._lingering:
            self._real.close()
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel(self._header_timer)
        self._cancel(self._linger_timer)
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._header_timer is None and not self._real.is_closing():
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.cycle is None or self.cycle.response_complete:
            log.debug("closing a connection that sent no complete request in %.0f s", self.header_timeout_s)
            self._real.close()

    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()

    def close_transport(self) -> None:
        """Close now, or linger when the client is still sending the body of the request just answered."""
        real = self._real
        if real.is_closing() or self._lingering:
            return
        if self.conn.their_state is h11.SEND_BODY and real.can_write_eof():
            self._lingering = True
            real.write_eof()
            real.resume_reading()
            self._linger_timer = self.loop.call_later(self.linger_s, real.close)
            return
        real.close()


def protocol_class(limits: HttpLimits) -> type[GuardedH11Protocol]:
    """A GuardedH11Protocol subclass carrying ``limits`` (uvicorn instantiates the class it is given)."""
    return type("FrameH11Protocol", (GuardedH11Protocol,), {
        "header_timeout_s": limits.header_timeout_s, "max_connections": limits.max_connections})
