"""Throughput and latency workloads: issue #6's mixed chat batch and a single long stream."""

from __future__ import annotations

from typing import Any

from frame.interfaces.workload import Workload, WorkloadContext, WorkloadRequest, greedy


def _chat_prompt(ctx: WorkloadContext, length: int) -> tuple[int, ...]:
    """A user message of random tokens inside the model's chat template, ``length`` tokens in all."""
    head, tail = ctx.chat_frame()
    return tuple(head + ctx.tokens(max(1, length - len(head) - len(tail))) + tail)


def _mixed_batch(ctx: WorkloadContext, p: dict[str, Any]) -> list[WorkloadRequest]:
    return [WorkloadRequest(_chat_prompt(ctx, ctx.length(p["prompt_len"])), greedy(p["max_tokens"]))
            for _ in range(p["num_requests"])]


def _single_stream(ctx: WorkloadContext, p: dict[str, Any]) -> list[WorkloadRequest]:
    return [WorkloadRequest(_chat_prompt(ctx, ctx.length(p["prompt_len"])), greedy(p["max_tokens"]))]


_PROMPT_LEN = "tokens of each prompt, chat template included (a length or [lo, hi])"
_MAX_TOKENS = "new tokens per request (greedy, ignore_eos)"

BATCH_WORKLOADS = [
    Workload("mixed_batch", "chat prompts of mixed lengths, all at once, fixed output length (issue #6)",
             {"num_requests": 64, "prompt_len": [50, 400], "max_tokens": 128}, _mixed_batch,
             {"num_requests": "how many requests", "prompt_len": _PROMPT_LEN, "max_tokens": _MAX_TOKENS}),
    Workload("single_stream", "one chat request streaming a long answer (latency)",
             {"prompt_len": 32, "max_tokens": 256}, _single_stream,
             {"prompt_len": _PROMPT_LEN, "max_tokens": _MAX_TOKENS}),
]
