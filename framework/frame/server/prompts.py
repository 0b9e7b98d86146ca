"""Prompts: what a request sends, turned into token ids off the event loop and within the server's limits.

Chat templates render in killable worker processes (:class:`~frame.server.render_pool.RenderPool`); tokenising
and detokenising run in a small thread pool, since Hugging Face tokenizers release the GIL and their work is
linear in the text, which ``--max-prompt-chars`` (and the body limit) bound. A thread cannot be stopped, so a
tokenisation past ``--tokenize-timeout`` is answered with a 400 while it finishes in the background.

Request-supplied templates (``--trust-request-chat-template``) wait in a lane of their own before they take a
worker: at most all workers but one render them at once, so clients sending slow templates (each up to the time
limit) never hold every worker, and the model's own template always finds one within a render. Inside the lane
each client (its API key when the server has keys, else its address) may have at most
``--max-template-renders-per-client`` templates rendering or waiting; the next is a 429, so one client flooding
slow templates holds only its share of the lane and another client's template finds a place at once.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from frame.engine.wire.render import Init, Render
from frame.errors import FrameUsageError
from frame.server.errors import ServerError
from frame.server.handoff import check_plain
from frame.server.render_pool import REPLACED, START_TIMEOUT_S, RenderPool
from frame.server.schemas import ChatMessage
from frame.server.settings import ServerSettings
from frame.server.tools import template_message

T = TypeVar("T")
#: Address space a render worker may take beyond what it holds after starting.
RENDER_MEMORY_BYTES = 1 << 30


def render_init(tokenizer: Any) -> Init:
    """What a render worker needs of the tokenizer: its chat template and its special tokens, as plain data."""
    try:
        template = tokenizer.get_chat_template()
    except ValueError:  # the model has no chat template
        template = None
    variables = {name: value if isinstance(value, (str, list)) else str(value)
                 for name, value in tokenizer.special_tokens_map.items()}
    return Init(template, variables, RENDER_MEMORY_BYTES)


def tokenizer_arguments(tokenizer: Any) -> frozenset[str]:
    """Names that steer ``apply_chat_template`` or the tokenizer (``return_tensors``, ``tokenize``, ...), which a
    request's ``chat_template_kwargs`` may not use; the template's own variables (``messages``) too."""
    params = inspect.signature(tokenizer.apply_chat_template).parameters
    named = {n for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return frozenset(named | {"messages", "conversations"}) - {"chat_template"}


class Prompts:
    """Token ids from text, conversations through the chat template, and text from token ids."""

    def __init__(self, tokenizer: Any, pool: RenderPool, settings: ServerSettings) -> None:
        self.tokenizer, self.pool, self.settings = tokenizer, pool, settings
        self.reserved = tokenizer_arguments(tokenizer)
        # With one worker there is none to keep back: request templates then share it (docs/serving.md).
        lane = max(pool.size - 1, 1)
        self.request_lane = asyncio.Semaphore(lane)
        self.per_client = settings.max_template_renders_per_client or max(lane // 2, 1)
        self._rendering: dict[str, int] = {}  # request templates rendering or waiting, by client
        self._threads = ThreadPoolExecutor(max_workers=settings.tokenizer_workers, thread_name_prefix="tokenize")

    @property
    def max_chars(self) -> int:
        return self.settings.limits.max_prompt_chars

    async def _in_thread(self, fn: Callable[[], T], what: str) -> T:
        timeout = self.settings.tokenize_timeout_s
        future = asyncio.get_running_loop().run_in_executor(self._threads, fn)
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise ServerError(f"{what} took longer than this server's limit of {timeout:g} s (--tokenize-timeout); "
                              "send a shorter prompt.", status=400, code="tokenize_timeout", param="prompt") from None

    async def encode(self, texts: list[str], *, add_special_tokens: bool = True,
                     param: str = "prompt") -> list[list[int]]:
        """Token ids of each text (a 400 naming the limit when they hold too many characters in all)."""
        total = sum(len(t) for t in texts)
        if total > self.max_chars:
            raise ServerError(f"{param} holds {total} characters, over this server's limit of {self.max_chars} "
                              "(--max-prompt-chars); send a shorter prompt.", status=400, code="limit_exceeded",
                              param=param)
        if any(not t for t in texts):
            raise FrameUsageError(f"{param} is empty; send at least one character.", param=param)

        def run() -> list[list[int]]:
            return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=add_special_tokens).input_ids]

        return await self._in_thread(run, "Tokenising the prompt")

    async def decode(self, ids: list[int]) -> str:
        return await self._in_thread(lambda: self.tokenizer.decode(ids), "Detokenising")

    def _template(self, template: str | None, variables: dict[str, Any]) -> str | None:
        """The request's own template, if it sent one and the operator trusts request templates."""
        from_kwargs = variables.pop("chat_template", None)
        chosen = template if template is not None else from_kwargs
        if chosen is None:
            return None
        param = "chat_template" if template is not None else "chat_template_kwargs.chat_template"
        if not self.settings.trust_request_chat_template:
            raise ServerError("This server renders only the model's own chat template; remove chat_template (the "
                              "operator can allow request templates with --trust-request-chat-template).",
                              status=400, code="chat_template_not_allowed", param=param)
        if not isinstance(chosen, str) or not chosen:
            raise FrameUsageError(f"{param} must be a non-empty string holding a Jinja template.", param=param)
        return chosen

    async def chat(self, messages: list[ChatMessage], add_generation_prompt: bool, template: str | None = None,
                   kwargs: dict[str, Any] | None = None, tools: list[dict[str, Any]] | None = None,
                   client: str = "") -> list[int]:
        """Token ids of a conversation through the chat template (the model's, or a trusted request's), with the
        request's tools when it has any; ``client`` (:func:`frame.server.auth.client_of`) is who sent it, for the
        per-client cap on request templates."""
        variables = dict(kwargs or {})
        steering = sorted(self.reserved.intersection(variables))
        if steering:
            raise FrameUsageError(f"chat_template_kwargs.{steering[0]} is an argument of apply_chat_template, not a "
                                  "template variable; remove it.", param="chat_template_kwargs")
        own = self._template(template, variables)
        if own is None and self.pool.init.template is None:
            raise ServerError("This model has no chat template; use /v1/completions.", status=400,
                              code="no_chat_template", param="messages")
        check_plain(variables, "chat_template_kwargs")
        conversation = [template_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
        check_plain(conversation, "messages")
        if tools is not None:
            check_plain(tools, "tools")
            variables["tools"] = tools
        job = Render(conversation, add_generation_prompt, variables, own, self.max_chars)
        text = await (self.pool.render(job) if own is None else self._render_requested(job, client))
        if not text:
            raise FrameUsageError("The chat template rendered these messages as nothing; send other messages.",
                                  param="messages")
        ids = await self.encode([text], add_special_tokens=False, param="messages")
        return ids[0]

    async def _render_requested(self, job: Render, client: str) -> str:
        """Render a request-supplied template in its lane, within ``client``'s cap; waiting is bounded as the pool
        bounds its own wait."""
        held = self._rendering.get(client, 0)
        if held >= self.per_client:
            raise ServerError(f"This client has {held} request chat templates rendering or waiting, the server's "
                              "limit per client (--max-template-renders-per-client); retry when one has finished.",
                              status=429, code="too_many_requests", param="chat_template",
                              headers={"Retry-After": "1"})
        self._rendering[client] = held + 1
        try:
            return await self._in_lane(job)
        finally:
            left = self._rendering[client] - 1
            if left:
                self._rendering[client] = left
            else:
                del self._rendering[client]

    async def _in_lane(self, job: Render) -> str:
        wait_s = START_TIMEOUT_S + self.pool.timeout_s
        try:
            await asyncio.wait_for(self.request_lane.acquire(), wait_s)
        except asyncio.TimeoutError:
            raise ServerError(f"No chat-template worker was free for a request template within {wait_s:.0f} s; retry "
                              "shortly.", status=503, code="server_busy", headers={"Retry-After": "1"}) from None
        try:
            return await self.pool.render(job)
        except ServerError as err:
            if err.code in REPLACED:
                # This render's worker was killed and is replaced in the background (about a second): its place in
                # the lane is given back only once the pool is whole, so the next slow template cannot take the
                # last worker. Renders whose worker lives on give their place back at once.
                deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
                while self.pool.short and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.05)
            raise
        finally:
            self.request_lane.release()

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
