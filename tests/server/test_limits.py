"""The HTTP layer's limits against a real server: body size (413) without memory growth, header and body time
limits, the connection cap, and connections that end cleanly (``Connection: close``) after an error."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx

GOOD = b'{"prompt": "Hello", "max_tokens": 2}'
JSON = {"content-type": "application/json"}
RSS_GROWTH_BOUND = 32 << 20  # bytes; a 50 MB body that were read would grow the server by far more


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def connect(server, source: str | None = None) -> socket.socket:
    """A raw connection to ``server``; ``source``: another loopback address to connect from (127.0.0.2, ...)."""
    host, port = server.base_url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=60,
                                    source_address=(source, 0) if source else None)


def request_bytes(body: bytes, path: str = "/v1/completions") -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body, read off a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return int(lines[0].split()[1]), headers, body


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def test_50mb_body_is_413_without_memory_growth(mp_server):
    pid = mp_server.proc.pid
    before = rss(pid)
    body = b'{"prompt": "' + b"a" * (50 << 20) + b'"}'
    resp = httpx.post(f"{mp_server.base_url}/v1/completions", content=body,
                      headers=JSON, timeout=60)
    assert resp.status_code == 413
    assert resp.headers["connection"] == "close"
    error = resp.json()["error"]
    assert error["code"] == "request_too_large" and "--max-body-bytes" in error["message"]

    def chunks():  # no Content-Length: the limit is found while reading
        for _ in range(50):
            yield b"a" * (1 << 20)

    resp = httpx.post(f"{mp_server.base_url}/v1/completions", content=chunks(),
                      headers=JSON, timeout=60)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"
    assert rss(pid) - before < RSS_GROWTH_BOUND
    assert httpx.post(f"{mp_server.base_url}/v1/completions", content=GOOD, headers=JSON, timeout=60).status_code == 200


def test_half_sent_requests_are_closed_after_the_header_timeout(mp_server, limits):
    socks = [connect(mp_server) for _ in range(20)]
    for i, sock in enumerate(socks):
        if i % 2:  # half of them send half a request; the others send nothing at all
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Le")
    t0 = time.monotonic()
    for sock in socks:
        sock.settimeout(limits["header_timeout_s"] + 30)
        assert closed_by_server(sock)
        sock.close()
    assert time.monotonic() - t0 < limits["header_timeout_s"] + 30


def test_a_body_that_stops_arriving_is_408(mp_server, limits):
    with connect(mp_server) as sock:
        sock.sendall(request_bytes(GOOD)[:-10])  # the headers and all but 10 bytes of the body
        status, headers, body = read_response(sock)
        assert status == 408 and headers["connection"] == "close"
        assert "--body-timeout" in json.loads(body)["error"]["message"]
        assert closed_by_server(sock)


def test_connection_survives_a_400_and_closes_after_a_413(mp_server):
    with connect(mp_server) as sock:
        sock.sendall(request_bytes(b'{"prompt": "Hello", "max_tokens": 0}'))
        status, headers, _ = read_response(sock)
        assert status == 400 and "connection" not in headers
        sock.sendall(request_bytes(GOOD))
        status, _, body = read_response(sock)
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 2
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Length: 999999999\r\n\r\n")
        status, headers, _ = read_response(sock)
        assert status == 413 and headers["connection"] == "close"
        assert closed_by_server(sock)


def test_connections_past_the_caps_get_429_then_503(inproc_server, limits):
    """One address may hold half the connections (then 429); the cap over all of them is a 503; both readable,
    with Retry-After. Held from two loopback addresses, since one alone cannot reach the global cap."""
    cap = int(limits["inproc_max_connections"])
    held = [connect(inproc_server) for _ in range(cap // 2)]
    try:
        with connect(inproc_server) as extra:
            status, headers, body = read_response(extra)
            assert status == 429 and headers["connection"] == "close" and headers["retry-after"] == "1"
            assert "--max-connections-per-client" in json.loads(body)["error"]["message"]
        held += [connect(inproc_server, "127.0.0.3") for _ in range(cap - cap // 2)]
        with connect(inproc_server, "127.0.0.4") as extra:
            extra.sendall(request_bytes(GOOD))  # a request already sent does not turn the refusal into a reset
            status, headers, body = read_response(extra)
            assert status == 503 and headers["connection"] == "close" and headers["retry-after"] == "1"
            assert json.loads(body)["error"]["code"] == "too_many_connections"
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 30
    while True:  # the held connections are released as the server sees them close
        resp = httpx.post(f"{inproc_server.base_url}/v1/completions", content=GOOD, headers=JSON, timeout=60)
        if resp.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert resp.status_code == 200


def test_an_unexpected_error_is_a_json_500_that_closes_the_connection():
    import asyncio

    from frame.server.guard import RequestGuard

    async def broken(scope, receive, send):
        raise RuntimeError("a bug")

    async def call() -> httpx.Response:
        app = RequestGuard(broken, max_body_bytes=1000, body_timeout_s=5, draining=lambda: False)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.get("/x")

    resp = asyncio.run(call())
    assert resp.status_code == 500 and resp.headers["connection"] == "close"
    assert resp.json()["error"] == {"message": "The server failed to answer this request; retry it.",
                                    "type": "server_error", "param": None, "code": "internal_error"}
