"""POST /reset_prefix_cache: not served unless asked for; served, the next identical prompt finds nothing cached."""

from __future__ import annotations

PROMPT = "A prompt long enough to fill several blocks of the prefix cache, sent three times. " * 8


def test_not_served_by_default(inproc_server) -> None:
    with inproc_server.client() as c:
        assert c.post("/reset_prefix_cache").status_code == 404


def test_a_reset_empties_the_prefix_cache(mp_server) -> None:
    with mp_server.client() as c:

        def cached_tokens() -> int:
            resp = c.post("/v1/completions", json={"model": "SmolLM2-135M-Instruct", "prompt": PROMPT,
                                                   "max_tokens": 1, "temperature": 0})
            assert resp.status_code == 200, resp.text
            return resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

        cached_tokens()
        assert cached_tokens() > 0
        resp = c.post("/reset_prefix_cache")
        assert resp.status_code == 200 and resp.json() == {"success": True}
        assert cached_tokens() == 0
