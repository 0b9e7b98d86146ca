"""The chat-template workers on their own: they render as transformers does, and a template that spins or grows is
cut off (time limit: the worker is killed and replaced; memory cap: MemoryError) with a 400 naming the limit."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from frame.engine.wire.render import Render
from frame.model_source import ModelSource
from frame.server.errors import ServerError
from frame.server.prompts import render_init
from frame.server.render_pool import RenderPool

TIMEOUT_S = 2.0
MESSAGES = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"}]


@pytest.fixture(scope="module")
def tokenizer():
    return ModelSource.open(None).tokenizer


def _job(template: str | None = None, max_chars: int = 1 << 20) -> Render:
    return Render(MESSAGES, True, {}, template, max_chars)


def test_workers_render_as_transformers_and_survive_hostile_templates(tokenizer):
    async def run() -> None:
        pool = RenderPool(render_init(tokenizer), size=1, timeout_s=TIMEOUT_S)
        await pool.start()
        try:
            want = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
            assert await pool.render(_job()) == want

            first = pool.pids
            for pid in first:  # a spinning template yields the cores to the engine
                assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16] == "10"
            t0 = time.monotonic()
            with pytest.raises(ServerError) as err:
                await pool.render(_job("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                                       "{% endfor %}"))
            assert err.value.code == "template_timeout" and "--tokenize-timeout" in err.value.message
            assert time.monotonic() - t0 < TIMEOUT_S + 20  # cut at the limit (generous margin: a busy machine)

            with pytest.raises(ServerError) as err:  # a 10 GB string: past the worker's address-space cap
                await pool.render(_job("{{ 'x' * 10000000000 }}"))
            assert err.value.code == "template_too_large" and "MiB" in err.value.message

            with pytest.raises(ServerError) as err:
                await pool.render(_job(max_chars=10))
            assert err.value.code == "template_too_large" and "--max-prompt-chars" in err.value.message

            assert await pool.render(_job()) == want  # a fresh worker took over
            assert pool.pids and pool.pids != first
        finally:
            await pool.close()
        assert pool.pids == []

    asyncio.run(run())


def test_a_job_msgpack_cannot_carry_is_a_400_and_costs_no_worker(tokenizer):
    """The pool's own guard, under the server's field check: a one-worker pool refuses two jobs holding 2**70
    (msgpack's OverflowError) and still renders the next conversation with the same worker."""

    async def run() -> None:
        pool = RenderPool(render_init(tokenizer), size=1, timeout_s=TIMEOUT_S)
        await pool.start()
        try:
            first = pool.pids
            for _ in range(2):
                with pytest.raises(ServerError) as err:
                    await pool.render(Render(MESSAGES, True, {"n": 2**70}, None, 1 << 20))
                assert err.value.status == 400 and "64 bits" in err.value.message
            assert await pool.render(_job()) and pool.pids == first and pool.short == 0
        finally:
            await pool.close()

    asyncio.run(run())


def test_a_signal_to_the_process_group_leaves_the_workers_to_their_pool(tokenizer):
    """Ctrl-C or a SIGTERM sent to the server's whole process group reaches the workers too: they ignore it and
    keep serving, so the pool does not read their exit as a kill from outside (and log it as an error) before
    it closes them itself."""

    async def run() -> None:
        pool = RenderPool(render_init(tokenizer), size=1, timeout_s=TIMEOUT_S)
        await pool.start()
        try:
            first = pool.pids
            for sig in (signal.SIGINT, signal.SIGTERM):
                os.kill(first[0], sig)
            await asyncio.sleep(0.5)
            assert await pool.render(_job()) and pool.pids == first and pool.short == 0
        finally:
            await pool.close()
        assert pool.pids == []

    asyncio.run(run())
