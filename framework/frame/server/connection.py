"""GuardedH11Protocol: uvicorn's h11 protocol with the connection limits uvicorn lacks.

- **Header timeout.** A connection must deliver a request's complete headers within ``header_timeout_s`` of
  connecting (or of the first byte of a later request on a kept-alive connection), else it is closed. uvicorn
  only times out idle kept-alive connections, so a client that sends half a request line holds its socket and
  file descriptor forever (thousands of them exhaust the process's descriptors, before any API key is checked).
- **Header size.** A request's head (request line and headers) is at most ``max_header_bytes``, however its bytes
  arrive: h11 checks its limit only while a head is incomplete, so a 119 KB head in one write passed it. A head
  over the limit gets a 431 in the OpenAI shape and the connection is closed.
- **Connection caps.** Past ``max_connections_per_client`` open connections from one address, a new one from it
  gets a 429; past ``max_connections`` in all, a new one gets a 503; both in the OpenAI shape with ``Retry-After``.
  So a single client (slow connections that reconnect) cannot hold every slot, and whoever is refused reads why: the
  refusal is sent before the request is read, then the connection lingers (below) so the client's request bytes
  do not turn the close into a reset that destroys the answer. A refused connection holds no slot, and at most
  ``MAX_REFUSING`` of them linger at once (past that they are closed at once).
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
import re
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from frame.server.errors import error_body
from frame.server.settings import HttpLimits

log = logging.getLogger("frame.server")
#: Seconds a closing connection keeps reading what its client still sends.
LINGER_S = 2.0
#: Refused connections that may linger at once (each holds a descriptor for up to LINGER_S).
MAX_REFUSING = 256


#: The blank line that ends a request's head (h11 accepts a bare LF too).
_HEAD_END = re.compile(rb"\n\r?\n")


def _plain_response(status: int, reason: str, message: str, code: str, extra: str = "") -> bytes:
    body = json.dumps(error_body(message, status, code)).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{extra}connection: close\r\n\r\n")
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
    """The h11 protocol with a header timeout, a header size limit, connection caps and a lingering close.

    ``per_client`` (open connections by client address) and ``refusing`` (a one-item list: refused connections
    lingering now) are shared by every connection of one server: :func:`protocol_class` gives each server its own.
    """

    header_timeout_s: float = 10.0
    max_connections: int = 1024
    max_connections_per_client: int = 512
    max_header_bytes: int = 16 << 10
    linger_s: float = LINGER_S
    per_client: ClassVar[dict[str, int]] = {}
    refusing: ClassVar[list[int]] = [0]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._real = transport
        self._header_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._lingering = self._counted = self._refusing_slot = False
        self._head_bytes, self._head_tail = 0, b""
        super().connection_made(_LingeringTransport(transport, self))  # type: ignore[arg-type]
        self._host = self.client[0] if self.client else ""
        from_host = self.per_client.get(self._host, 0)
        if len(self.connections) > self.max_connections:
            log.warning("refusing a connection: %d open, the limit is %d", len(self.connections) - 1,
                        self.max_connections)
            self._refuse(_plain_response(503, "Service Unavailable", f"The server has {self.max_connections} open "
                                         "connections, its limit (--max-connections); retry shortly.",
                                         "too_many_connections", "retry-after: 1\r\n"))
            return
        if from_host >= self.max_connections_per_client:
            log.warning("refusing a connection from %s: it has %d open, the limit per client is %d", self._host,
                        from_host, self.max_connections_per_client)
            self._refuse(_plain_response(429, "Too Many Requests", f"This client has {from_host} open connections, "
                                         "the server's limit per client address (--max-connections-per-client); "
                                         "close some or retry shortly.", "too_many_connections",
                                         "retry-after: 1\r\n"))
            return
        self.per_client[self._host] = from_host + 1
        self._counted = True
        self._arm_header_timer()

    def _refuse(self, response: bytes) -> None:
        """Answer before reading, hold no slot, and linger (when few others do) so the answer is read."""
        self.connections.discard(self)
        self._real.write(response)
        if self.refusing[0] >= MAX_REFUSING or not self._real.can_write_eof():
            self._real.close()
            return
        self.refusing[0] += 1
        self._refusing_slot = True
        self._linger()

    def _linger(self) -> None:
        real = self._real
        self._lingering = True
        real.write_eof()
        real.resume_reading()
        self._linger_timer = self.loop.call_later(self.linger_s, real.close)

    def _head_too_large(self, data: bytes) -> bool:
        """Whether the request head being received passes ``max_header_bytes`` with ``data``."""
        if self.conn.their_state is not h11.IDLE:
            return False
        window = self._head_tail + data
        end = _HEAD_END.search(window)
        if end is None:
            self._head_bytes += len(data)
            self._head_tail = window[-2:]
            return self._head_bytes > self.max_header_bytes
        size = self._head_bytes - len(self._head_tail) + end.end()
        self._head_bytes, self._head_tail = 0, b""
        return size > self.max_header_bytes

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the answer is sent; what the client still sends is read and dropped
        if self._head_too_large(data):
            log.warning("refusing a request whose head is over %d bytes", self.max_header_bytes)
            self._cancel(self._header_timer)
            self._real.write(_plain_response(
                431, "Request Header Fields Too Large", f"The request's headers are over this server's limit of "
                f"{self.max_header_bytes} bytes; send smaller headers.", "headers_too_large"))
            self._linger()
            return
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
        if self._refusing_slot:
            self._refusing_slot = False
            self.refusing[0] -= 1
        if self._counted:
            self._counted = False
            left = self.per_client[self._host] - 1
            if left:
                self.per_client[self._host] = left
            else:
                del self.per_client[self._host]
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
            self._linger()
            return
        real.close()


def protocol_class(limits: HttpLimits) -> type[GuardedH11Protocol]:
    """A GuardedH11Protocol subclass carrying ``limits`` (uvicorn instantiates the class it is given)."""
    return type("FrameH11Protocol", (GuardedH11Protocol,), {
        "header_timeout_s": limits.header_timeout_s, "max_connections": limits.max_connections,
        "max_connections_per_client": limits.per_client_cap, "max_header_bytes": limits.max_header_bytes,
        "per_client": {}, "refusing": [0]})
