"""32 concurrent streaming requests complete correctly with the engine in a child process and in-process."""

from __future__ import annotations

import asyncio

import openai
import pytest

PROMPTS = ["The weather today is", "My favourite food is", "In the year 2050,", "The best way to learn is"]


@pytest.mark.parametrize("server_fixture", ["mp_server", "inproc_server"])
def test_32_concurrent_streams(request, server_fixture):
    server = request.getfixturevalue(server_fixture)

    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
        reference = {}
        for p in PROMPTS:  # one at a time: the expected greedy text of each prompt
            whole = await client.completions.create(model="SmolLM2-135M-Instruct", prompt=p, max_tokens=12,
                                                    temperature=0)
            reference[p] = whole.choices[0].text

        async def stream(prompt: str) -> tuple[str, str, int]:
            chunks = await client.completions.create(model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=12,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True})
            text, finish, tokens = "", "", 0
            async for chunk in chunks:
                if chunk.choices:
                    text += chunk.choices[0].text
                    finish = chunk.choices[0].finish_reason or finish
                if chunk.usage:
                    tokens = chunk.usage.completion_tokens
            return text, finish, tokens

        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(32)]
        results = await asyncio.gather(*(stream(p) for p in prompts))
        for prompt, (text, finish, tokens) in zip(prompts, results, strict=True):
            assert (text, finish, tokens) == (reference[prompt], "length", 12)
        await client.close()

    asyncio.run(run())
