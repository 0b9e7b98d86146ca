"""One assistant turn through the chat pipeline, for the routes that speak other APIs than chat completions.

:func:`start_chat` does what ``/v1/chat/completions`` does before generating (checks, constraints, tools, the chat
template, sampling params, admission) and returns the admitted :class:`ChatRun`; ``/v1/chat/completions`` uses it
too. ``/v1/responses`` and ``/v1/messages`` translate their requests into a :class:`ChatCompletionRequest` and read
one choice back as a :class:`TurnEnd` (:func:`finished_turn`) or as text pieces then a TurnEnd
(:func:`turn_stream`), so rendering, tools and constraints live in one place.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from starlette.background import BackgroundTask

from frame.errors import FrameUsageError
from frame.interfaces.tool_parser import ParsedText, ToolCall, ToolParser
from frame.outputs import CompletionOutput, RequestOutput
from frame.server.auth import client_of
from frame.server.checks import check_length, check_model, sampling_params
from frame.server.constraints import requested_constraint
from frame.server.deps import cache_salt, default_max_tokens, new_id
from frame.server.errors import ServerError
from frame.server.formatting import sse_stream
from frame.server.generation import ClientDisconnectedError, Generation, PromptJob
from frame.server.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    JsonSchemaFormat,
    MessageToolCall,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    ToolDefinition,
)
from frame.server.state import ServerState
from frame.server.tools import ToolPlan, finish_reason, parse_output, plan_tools, stream_safe_prefix, template_tools


@dataclass
class ChatRun:
    """A chat request admitted to the engine: its generation, its tool plan, the parser of ``auto`` mode (None
    otherwise) and the number of top logprobs asked for (None: no logprobs)."""

    gen: Generation
    plan: ToolPlan
    parser: ToolParser | None
    k: int | None

    def parse(self, text: str) -> ParsedText:
        return parse_output(self.plan, text, self.parser)


@dataclass(frozen=True)
class TurnEnd:
    """How one choice ended: its content (None when it is only calls), its calls, the finish reason as chat
    completions says it (``stop``, ``length``, ``tool_calls``, ``abort``) and the stop string or token it hit."""

    content: str | None
    calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None


def tool_call(call_id: str, name: str, arguments: str) -> MessageToolCall:
    """A call an earlier assistant turn made, as a chat message carries it."""
    return MessageToolCall(id=call_id, function=FunctionCall(name=name, arguments=arguments))


def translated(messages: list[ChatMessage], functions: list[FunctionDefinition], *, choice: str | None = None,
               named: str | None = None, fmt: str | None = None, schema: dict[str, Any] | None = None,
               schema_name: str = "output", **fields: Any) -> ChatCompletionRequest:
    """The chat completions request another API's request amounts to: its conversation, its functions, the tool
    ``choice`` (``none``, ``auto``, ``required``) or the one function ``named``, the output format (``text``,
    ``json_object``, ``json_schema`` with ``schema``) and chat's own ``fields`` (max_tokens, stop, sampling)."""
    tools = [ToolDefinition(type="function", function=fn) for fn in functions] or None
    tool_choice: Any = choice if named is None else NamedToolChoice(type="function",
                                                                     function=NamedFunction(name=named))
    response_format = None if fmt is None else ResponseFormat(type=fmt, json_schema=None if fmt != "json_schema"
                                                              else JsonSchemaFormat(name=schema_name, schema=schema))
    try:
        return ChatCompletionRequest(messages=messages, tools=tools, tool_choice=tool_choice,
                                     response_format=response_format, **fields)
    except ValidationError as err:  # the other API's schema let through what chat's refuses
        error = err.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise FrameUsageError(f"This request has no chat completions equivalent: {where}: {error['msg']}.",
                              param=where or None) from None


def _logprobs_k(req: ChatCompletionRequest) -> int | None:
    if req.top_logprobs is not None and not req.logprobs:
        raise FrameUsageError("top_logprobs needs logprobs set to true.", param="top_logprobs")
    if not req.logprobs:
        return None
    return req.top_logprobs or 0


async def start_chat(req: ChatCompletionRequest, raw: Request, state: ServerState, prefix: str = "chatcmpl",
                     ) -> ChatRun:
    """Check ``req``, render it, and admit its generation (the caller runs or streams it, then releases it)."""
    check_model(req.model, state.model_names)
    if req.stream_options is not None and not req.stream:
        raise ServerError("stream_options is only allowed when stream is true.", status=400, code="unsupported",
                          param="stream_options")
    k = _logprobs_k(req)
    if k is not None and k > state.settings.limits.max_logprobs:
        raise ServerError(f"top_logprobs is {k}, over this server's limit of {state.settings.limits.max_logprobs}.",
                          status=400, code="limit_exceeded", param="top_logprobs")
    plan = plan_tools(req)
    constraint = (plan.constraint, "tools") if plan.constraint is not None else requested_constraint(req)
    if constraint is not None:
        await state.constraints.check(*constraint, raw.is_disconnected)
    # Loaded now, so a broken parser fails this request, not a stream mid-way.
    parser = state.tool_parser if plan.mode == "auto" else None
    ids = await state.prompts.chat(req.messages, req.add_generation_prompt, req.chat_template,
                                   req.chat_template_kwargs, template_tools(req, plan), client_of(raw.scope))
    asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = asked if asked is not None else default_max_tokens(state, len(ids))
    params = sampling_params(req, state.settings.limits, max_tokens=max_tokens, logprobs=k,
                             vocab_size=state.info.vocab_size,
                             max_speculative_tokens=state.info.max_speculative_tokens,
                             structured_outputs=constraint and constraint[0])
    check_length(len(ids), params.max_tokens, state.info.max_model_len)
    gen = Generation(state, new_id(prefix), [PromptJob(None, ids)], params, req.priority,
                     cache_salt(raw, req.cache_salt))
    if constraint is not None:
        await state.constraints.drop_if_gone(raw.is_disconnected)
    gen.admit()
    return ChatRun(gen, plan, parser, k)


def finished_turn(run: ChatRun, out: CompletionOutput) -> TurnEnd:
    """The TurnEnd of a finished choice."""
    parsed = run.parse(out.text)
    return TurnEnd(parsed.content, parsed.calls, finish_reason(out.finish_reason, parsed), out.stop_reason)


async def finish(run: ChatRun, raw: Request) -> tuple[RequestOutput, TurnEnd] | None:
    """Run to the end: the output and its first choice's TurnEnd (None when the client went away)."""
    try:
        results = await run.gen.collect(raw)
    except ClientDisconnectedError:
        return None
    return results[0], finished_turn(run, results[0].outputs[0])


def event_stream(run: ChatRun, events: AsyncIterator[str], error: Callable[[dict[str, Any]], str],
                 ) -> StreamingResponse:
    """The response of a named-event stream: no ``[DONE]``, a failure ends it with ``error`` (of the OpenAI error
    body), and the run's waiting places go back if it never started."""
    return StreamingResponse(sse_stream(events, error=error, done=None), media_type="text/event-stream",
                             background=BackgroundTask(run.gen.release))


async def turn_stream(run: ChatRun) -> AsyncIterator[str | TurnEnd]:
    """The first choice's content as it may be shown (constrained calls never are; with ``auto``, what the parser
    calls safe), then its TurnEnd."""
    text, shown, end = "", 0, None
    async for _, item in run.gen.deltas():
        text += item.text
        if run.plan.mode == "none":
            safe = len(text)
        else:
            safe = 0 if run.plan.constrained else stream_safe_prefix(run.parser, text)  # type: ignore[arg-type]
        if safe > shown:
            yield text[shown:safe]
            shown = safe
        if item.finish_reason is not None:
            parsed = run.parse(text)
            rest = (parsed.content or "")[shown:] if not run.plan.constrained or not parsed.calls else ""
            if rest:
                yield rest
            end = TurnEnd(parsed.content, parsed.calls, finish_reason(item.finish_reason, parsed), item.stop_reason)
    if end is not None:  # after the loop, which counts the cached tokens the final output reports
        yield end
