"""`frame serve --num-continuous-decode-steps 4`: the engine in its child process streams its tokens in groups and
gives the same greedy text, stops included, as a server taking one step at a time."""

from __future__ import annotations

import asyncio

import openai

from .conftest import start_serve, stop_serve

PROMPTS = ["The weather today is", "My favourite food is", "In the year 2050,"]
MODEL = "SmolLM2-135M-Instruct"


def test_streams_and_stops_match_a_server_of_single_steps(mp_server, tmp_path) -> None:
    server = start_serve(tmp_path, "--num-continuous-decode-steps", "4")
    try:
        async def texts(base_url: str, stream: bool, stop: list[str] | None = None) -> list[tuple[str, str]]:
            client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)

            async def one(prompt: str) -> tuple[str, str]:
                args = dict(model=MODEL, prompt=prompt, max_tokens=14, temperature=0, stop=stop)
                if not stream:
                    choice = (await client.completions.create(**args)).choices[0]
                    return choice.text, choice.finish_reason
                text, finish = "", ""
                async for chunk in await client.completions.create(**args, stream=True):
                    text += chunk.choices[0].text
                    finish = chunk.choices[0].finish_reason or finish
                return text, finish

            try:
                return list(await asyncio.gather(*(one(p) for p in PROMPTS)))
            finally:
                await client.close()

        reference = asyncio.run(texts(mp_server.base_url, stream=False))
        assert asyncio.run(texts(server.base_url, stream=True)) == reference
        assert asyncio.run(texts(server.base_url, stream=False)) == reference
        # A stop string in the middle of a group of four: the text ends before it, as with single steps.
        stop = [reference[0][0][len(reference[0][0]) // 2:][:3]]
        assert asyncio.run(texts(server.base_url, stream=True, stop=stop)) == asyncio.run(
            texts(mp_server.base_url, stream=False, stop=stop))
    finally:
        stop_serve(server)
