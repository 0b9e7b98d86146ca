"""The engine compiles a grammar off its loop (issue 36): requests it is already serving keep their pace meanwhile.

A constraint that takes seconds to compile is compiled twice: by the API server before admitting it (in its
constraint worker process) and by the engine (in its compile thread, the request waiting apart until its grammar is
ready). Ordinary requests sent all along never wait for either compile.
"""

from __future__ import annotations

import random
import threading
import time

import httpx


def _slow_choice() -> list[str]:
    """4,000 random 40-letter choices, never seen before: seconds to compile on this machine (each time)."""
    rng = random.Random()
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(40)) for _ in range(4000)]


def test_plain_requests_keep_their_pace_while_a_grammar_compiles(mp_server) -> None:
    plain = {"prompt": "Hello", "max_tokens": 4}
    with mp_server.client() as c:
        c.post("/v1/completions", json=plain)  # warm
        quiet = []
        for _ in range(4):
            started = time.monotonic()
            assert c.post("/v1/completions", json=plain).status_code == 200
            quiet.append(time.monotonic() - started)
    result: dict[str, object] = {}

    def constrained() -> None:
        started = time.monotonic()
        body = {"prompt": "Pick:", "max_tokens": 2, "structured_outputs": {"choice": _slow_choice()}}
        result["resp"] = httpx.post(f"{mp_server.base_url}/v1/completions", json=body, timeout=300)
        result["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=constrained)
    thread.start()
    during = []
    with mp_server.client() as c:
        while thread.is_alive():
            started = time.monotonic()
            assert c.post("/v1/completions", json=plain).status_code == 200
            during.append(time.monotonic() - started)
    thread.join()
    resp = result["resp"]
    assert resp.status_code == 200, resp.text  # type: ignore[union-attr]
    assert result["seconds"] > 2 * max(quiet), result  # the compiles did take seconds
    assert len(during) >= 3 and max(during) < max(quiet) + 1.5, (quiet, during, result["seconds"])
