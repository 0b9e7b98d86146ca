"""A streamed chat completion's first chunk (the role) goes out with the first token, not on arrival.

Clients time the first token by the first chunk that has choices (vLLM's `bench serve` does); a role chunk sent
before the prefill made frame's TTFT look like milliseconds and counted the whole prefill as decode time. The
generation here is a test double whose first token waits on an event, so the check involves no timing.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from frame.server.chat import _stream
from frame.server.tools import ToolPlan
from frame.server.turns import ChatRun


class FirstTokenWaits:
    """A Generation's streaming side: one token once ``ready`` is set, then the end."""

    request_id = "chatcmpl-test"

    def __init__(self) -> None:
        self.ready = asyncio.Event()

    async def deltas(self):
        await self.ready.wait()
        yield 0, SimpleNamespace(index=0, text="Hi", token_ids=[1], logprobs=None, finish_reason=None,
                                 stop_reason=None)
        yield 0, SimpleNamespace(index=0, text="", token_ids=[], logprobs=None, finish_reason="length",
                                 stop_reason=None)


def _chunks(texts: list[str]) -> list[dict]:
    return [json.loads(t.removeprefix("data: ")) for t in texts]


def test_the_role_chunk_waits_for_the_first_token() -> None:
    async def run() -> list[str]:
        gen = FirstTokenWaits()
        state = SimpleNamespace(model_name="m", tool_parser=None)
        req = SimpleNamespace(n=1, stream_options=None)
        run = ChatRun(gen, ToolPlan("none"), None, None)  # type: ignore[arg-type]
        stream = _stream(run, req, state, 0)  # type: ignore[arg-type]
        first = asyncio.ensure_future(stream.__anext__())
        for _ in range(20):  # let the stream run as far as it can without a token
            await asyncio.sleep(0)
        assert not first.done(), "a chunk went out before the first token"
        gen.ready.set()
        return [await first] + [text async for text in stream]

    role, token, end = _chunks(asyncio.run(run()))
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert token["choices"][0]["delta"] == {"content": "Hi"}
    assert end["choices"][0]["finish_reason"] == "length"
