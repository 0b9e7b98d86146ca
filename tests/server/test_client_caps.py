"""Issue 38: limits one client cannot get around. A request head over the header limit is a 431 however its bytes
arrive (h11 checks only heads that arrive in pieces); slow connections that reconnect from one address hold at most
that address's share of connections, and ordinary requests from another address are served meanwhile."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx

ORDINARY = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}
#: Slow connections that keep reconnecting from 127.0.0.1, and how long they keep at it.
SLOW_CONNECTIONS, SLOW_SECONDS = 150, 12.0


def _address(server) -> tuple[str, int]:
    host, port = server.base_url.removeprefix("http://").split(":")
    return host, int(port)


def _head(pad_bytes: int) -> bytes:
    lines = [f"X-Pad-{i}: {'a' * 990}\r\n" for i in range(pad_bytes // 1000)]
    return ("GET /v1/models HTTP/1.1\r\nHost: test\r\n" + "".join(lines) + "\r\n").encode()


def _status(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed without an answer: {data!r}"
        data += chunk
    return int(data.split(b" ", 2)[1]), data


def test_119_kb_of_headers_are_431_in_one_write_or_in_pieces(mp_server) -> None:
    head = _head(119_000)
    for pieces in (1, 60):
        with socket.create_connection(_address(mp_server), timeout=30) as sock:
            step = -(-len(head) // pieces)
            for i in range(0, len(head), step):
                sock.sendall(head[i:i + step])
            status, data = _status(sock)
            assert status == 431, data[:300]
            body = data.split(b"\r\n\r\n", 1)[1]
            assert b"connection: close" in data.lower() and b"headers_too_large" in body
    with socket.create_connection(_address(mp_server), timeout=30) as sock:  # 15 KB of headers: still served
        sock.sendall(_head(15_000))
        assert _status(sock)[0] == 200


async def _slow_clients(server, stop: threading.Event, seen: dict[str, int]) -> None:
    """SLOW_CONNECTIONS connections from 127.0.0.1 that each send half a request line and wait; when the server
    closes one (its header timeout, or the per-client cap's 429), it reconnects."""
    host, port = _address(server)

    async def one() -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, port, local_addr=("127.0.0.1", 0))
            except OSError:
                seen["connect_errors"] = seen.get("connect_errors", 0) + 1
                await asyncio.sleep(0.1)
                continue
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: slow\r\n")
            try:
                answer = await asyncio.wait_for(reader.read(200), 1.0)
                key = "refused_429" if answer.startswith(b"HTTP/1.1 429") else "closed"
                seen[key] = seen.get(key, 0) + 1
                await asyncio.sleep(0.05)
            except asyncio.TimeoutError:
                seen["held"] = seen.get("held", 0) + 1
                while not stop.is_set() and not reader.at_eof():
                    await asyncio.sleep(0.2)
            except OSError:
                seen["reset"] = seen.get("reset", 0) + 1
            finally:
                writer.close()

    await asyncio.gather(*(one() for _ in range(SLOW_CONNECTIONS)))


def test_slow_reconnecting_connections_from_one_address_leave_others_served(inproc_server, limits) -> None:
    stop, seen = threading.Event(), {}
    thread = threading.Thread(target=lambda: asyncio.run(_slow_clients(inproc_server, stop, seen)), daemon=True)
    thread.start()
    answers = []
    try:
        time.sleep(2.0)  # the slow clients have taken what their address may hold
        transport = httpx.HTTPTransport(local_address="127.0.0.2")
        deadline = time.monotonic() + SLOW_SECONDS
        with httpx.Client(base_url=inproc_server.base_url, transport=transport, timeout=60) as c:
            while time.monotonic() < deadline:
                answers.append(c.post("/v1/completions", json=ORDINARY, headers={"Connection": "close"}).status_code)
                time.sleep(0.3)
    finally:
        stop.set()
        thread.join(30)
    cap = int(limits["inproc_max_connections"]) // 2
    assert seen.get("held", 0) >= cap and seen.get("refused_429", 0) > 0, seen  # the cap was reached and held
    assert answers and set(answers) == {200}, answers
    deadline = time.monotonic() + 30  # the slow connections' slots come back once they are gone
    while (resp := httpx.post(f"{inproc_server.base_url}/v1/completions", json=ORDINARY, timeout=60)).status_code \
            != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert resp.status_code == 200, json.dumps(resp.json())
