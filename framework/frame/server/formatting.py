"""Response pieces in the OpenAI shapes: usage, completions logprobs, chat logprobs, SSE framing."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from frame.engine.client import EngineDeadError
from frame.errors import FrameUsageError
from frame.outputs import PositionLogprobs, RequestOutput
from frame.server.errors import dead_engine_body, error_body, usage_error_body

log = logging.getLogger("frame.server")

#: JSON has no -inf; a token the model rules out gets this logprob, as in vLLM.
_FLOOR = -9999.0


def _lp(value: float) -> float:
    return _FLOOR if math.isinf(value) or math.isnan(value) else value


def _top(position: PositionLogprobs, k: int) -> list[tuple[int, float, str]]:
    ranked = sorted((lp.rank, tid) for tid, lp in position.items() if lp.rank is not None)[:k]
    return [(tid, position[tid].logprob, position[tid].decoded_token or "") for _, tid in ranked]


def completion_logprobs(token_ids: list[int], positions: list[PositionLogprobs], k: int,
                        text_offset: int = 0) -> dict[str, Any]:
    """``choices[].logprobs`` of /v1/completions: tokens, their logprobs, the top ``k`` and text offsets."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for tid, position in zip(token_ids, positions, strict=False):
        sampled = position[tid]
        text = sampled.decoded_token or ""
        tokens.append(text)
        token_logprobs.append(_lp(sampled.logprob))
        top = {t: _lp(lp) for _, lp, t in _top(position, k)}
        top.setdefault(text, _lp(sampled.logprob))
        tops.append(top)
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def echo_logprobs(first_token: str, prompt_ids: list[int], prompt: list[PositionLogprobs | None],
                  token_ids: list[int], positions: list[PositionLogprobs], k: int) -> dict[str, Any]:
    """``choices[].logprobs`` of an ``echo`` completion: the prompt's tokens (the first, ``first_token``, has no
    logprob: None, as OpenAI and vLLM answer), then the completion's, text offsets running on over both."""
    scored: list[PositionLogprobs] = [p for p in prompt[1:] if p is not None]
    head = completion_logprobs(prompt_ids[1:], scored, k, len(first_token))
    end = head["text_offset"][-1] + len(head["tokens"][-1]) if head["tokens"] else len(first_token)
    tail = completion_logprobs(token_ids, positions, k, end)
    return {"tokens": [first_token, *head["tokens"], *tail["tokens"]],
            "token_logprobs": [None, *head["token_logprobs"], *tail["token_logprobs"]],
            "top_logprobs": [None, *head["top_logprobs"], *tail["top_logprobs"]],
            "text_offset": [0, *head["text_offset"], *tail["text_offset"]]}


def prompt_logprobs_json(prompt: list[PositionLogprobs | None], k: int) -> list[dict[str, Any] | None]:
    """vLLM's ``choices[].prompt_logprobs``: per prompt token None (the first) or, by token id, the prompt token's
    and the top ``k``'s ``logprob``, ``rank`` and ``decoded_token``."""
    out: list[dict[str, Any] | None] = [None]
    for position in prompt[1:]:
        assert position is not None
        own = next(iter(position))  # the prompt's own token comes first
        out.append({str(tid): {"logprob": _lp(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded_token}
                    for tid, lp in position.items() if tid == own or (lp.rank is not None and lp.rank <= k)})
    return out


def chat_logprobs(token_ids: list[int], positions: list[PositionLogprobs], k: int) -> dict[str, Any]:
    """``choices[].logprobs`` of /v1/chat/completions: ``{"content": [...]}`` with ``top_logprobs`` of ``k``."""
    content = []
    for tid, position in zip(token_ids, positions, strict=False):
        sampled = position[tid]
        text = sampled.decoded_token or ""
        content.append({
            "token": text, "logprob": _lp(sampled.logprob), "bytes": list(text.encode()),
            "top_logprobs": [{"token": t, "logprob": _lp(lp), "bytes": list(t.encode())}
                             for _, lp, t in _top(position, k)],
        })
    return {"content": content}


def usage(results: list[RequestOutput], details: bool = True) -> dict[str, Any]:
    """Token counts of finished requests: prompt (per prompt), completion (every choice) and cached."""
    prompt = sum(len(r.prompt_token_ids) for r in results)
    completion = sum(len(c.token_ids) for r in results for c in r.outputs)
    return usage_counts(prompt, completion, sum(r.num_cached_tokens for r in results), details)


def usage_counts(prompt: int, completion: int, cached: int, details: bool = True) -> dict[str, Any]:
    """``usage``; ``details=False`` (``--no-prompt-tokens-details``) leaves out the cached-token count."""
    counts: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                              "total_tokens": prompt + completion}
    if details:
        counts["prompt_tokens_details"] = {"cached_tokens": cached}
    return counts


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


DONE = sse("[DONE]")


async def sse_stream(chunks: AsyncIterator[str], error: Callable[[dict[str, Any]], str] = sse,
                     done: str | None = DONE) -> AsyncIterator[str]:
    """A stream's events, then ``done`` (OpenAI's ``[DONE]``; None: nothing), whatever happens: a failure after the
    response started (the engine died, the drain ran out of time, a bug) becomes one ``error`` event (by default
    the OpenAI error shape as data) before it."""
    try:
        async with aclosing(chunks):
            async for chunk in chunks:
                yield chunk
    except EngineDeadError as err:
        yield error(dead_engine_body(err))
    except FrameUsageError as err:
        yield error(usage_error_body(err))
    except Exception:
        log.exception("a stream failed")
        yield error(error_body("The server failed while streaming this response.", 500, "internal_error"))
    if done is not None:
        yield done


def named_event(event: str, data: dict[str, Any]) -> str:
    """One server-sent event with its ``event:`` name (the Responses and Messages APIs name every event)."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
