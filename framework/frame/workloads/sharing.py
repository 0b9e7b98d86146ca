"""Workloads whose prompts share prefixes in different shapes, and the no-sharing control.

Each builder takes a :class:`WorkloadContext` and its merged parameters; lengths given as ``[lo, hi]`` are drawn
uniformly per item. Every request decodes greedily with ``ignore_eos``, so output lengths do not depend on the
cache or scheduler under test.
"""

from __future__ import annotations

from typing import Any

from frame.interfaces.workload import Workload, WorkloadContext, WorkloadRequest, greedy


def _shared_prefix(ctx: WorkloadContext, p: dict[str, Any]) -> list[WorkloadRequest]:
    system = ctx.tokens(p["prefix_len"])
    tenants = max(1, int(p["tenants"]))
    return [
        WorkloadRequest(tuple(system + ctx.tokens(ctx.length(p["question_len"]))), greedy(p["max_tokens"]),
                        cache_salt=f"tenant-{i % tenants}" if tenants > 1 else None)
        for i in range(p["num_requests"])
    ]


def _multi_turn(ctx: WorkloadContext, p: dict[str, Any]) -> list[WorkloadRequest]:
    # Turn k resends the whole conversation: system, then (user, reply) pairs, then the k-th user message and
    # the assistant marker. Replies are synthetic, so turn k's prompt extends turn k-1's prompt exactly and the
    # shared prefix ends wherever turn k-1's prompt ended, almost never on a block boundary.
    user_mark, assistant_mark = ctx.encode("\nUser: "), ctx.encode("\nAssistant: ")
    requests = []
    for _ in range(p["num_conversations"]):
        history = ctx.tokens(p["system_len"])
        for turn in range(p["num_turns"]):
            if turn:
                history += ctx.tokens(ctx.length(p["reply_len"]))
            history += user_mark + ctx.tokens(ctx.length(p["user_len"])) + assistant_mark
            requests.append(WorkloadRequest(tuple(history), greedy(p["max_tokens"]), wave=turn))
    return requests


def _few_shot(ctx: WorkloadContext, p: dict[str, Any]) -> list[WorkloadRequest]:
    # A pool of examples; each variant is a fixed choice and order of `shots` of them. Requests of one variant
    # share instruction + examples; variants share the instruction and any leading examples they have in common.
    instruction = ctx.tokens(p["instruction_len"])
    pool = [ctx.tokens(ctx.length(p["example_len"])) for _ in range(p["num_examples"])]
    shots = min(p["shots"], len(pool))
    variants = [[t for ex in ctx.rng.sample(pool, shots) for t in ex] for _ in range(p["num_variants"])]
    return [
        WorkloadRequest(tuple(instruction + variants[i % len(variants)] + ctx.tokens(ctx.length(p["question_len"]))),
                        greedy(p["max_tokens"]))
        for i in range(p["num_requests"])
    ]


def _branching(ctx: WorkloadContext, p: dict[str, Any]) -> list[WorkloadRequest]:
    # One long context, then a tree of continuations `fanout` wide and `depth` deep; each leaf is a request,
    # so siblings share everything up to their parent's segment.
    prefixes = [ctx.tokens(p["context_len"])]
    for _ in range(p["depth"]):
        prefixes = [prefix + ctx.tokens(ctx.length(p["branch_len"])) for prefix in prefixes
                    for _ in range(p["fanout"])]
    return [WorkloadRequest(tuple(ids), greedy(p["max_tokens"])) for ids in prefixes]


def _no_sharing(ctx: WorkloadContext, p: dict[str, Any]) -> list[WorkloadRequest]:
    return [WorkloadRequest(tuple(ctx.tokens(ctx.length(p["prompt_len"]))), greedy(p["max_tokens"]))
            for _ in range(p["num_requests"])]


#: What the parameters the workloads below share mean.
_COMMON = {"num_requests": "how many requests", "max_tokens": "new tokens per request (greedy, ignore_eos)"}

SHARING_WORKLOADS = [
    Workload("shared_prefix", "one shared system prompt, then a distinct question per request",
             {"num_requests": 64, "prefix_len": 1000, "question_len": [16, 64], "max_tokens": 64, "tenants": 1},
             _shared_prefix,
             {**_COMMON, "prefix_len": "tokens of the shared system prompt",
              "question_len": "tokens of each request's own question (a length or [lo, hi])",
              "tenants": "cache salts the requests take in turn (1: no salt, all share the prompt's KV)"}),
    Workload("multi_turn", "chats where each turn resends the whole conversation; one wave per turn",
             {"num_conversations": 6, "num_turns": 4, "system_len": 40, "user_len": [20, 80],
              "reply_len": [20, 60], "max_tokens": 16},
             _multi_turn,
             {"num_conversations": "independent chats", "num_turns": "turns per chat, one wave each",
              "system_len": "tokens of each chat's system prompt", "user_len": "tokens of each user message",
              "reply_len": "tokens of each synthetic earlier reply", "max_tokens": _COMMON["max_tokens"]}),
    Workload("few_shot", "prompts sharing an instruction and one of a few fixed sets of examples",
             {"num_requests": 32, "num_examples": 8, "shots": 4, "num_variants": 4, "instruction_len": 40,
              "example_len": [60, 120], "question_len": [16, 48], "max_tokens": 16},
             _few_shot,
             {**_COMMON, "num_examples": "examples in the pool", "shots": "examples per prompt",
              "num_variants": "fixed choices and orders of examples the requests take in turn",
              "instruction_len": "tokens of the instruction every prompt starts with",
              "example_len": "tokens of each example", "question_len": "tokens of each request's own question"}),
    Workload("branching", "one long context, then a tree of continuations (fanout**depth requests)",
             {"context_len": 1500, "fanout": 4, "depth": 2, "branch_len": [8, 40], "max_tokens": 16},
             _branching,
             {"context_len": "tokens of the context every request starts with",
              "fanout": "continuations of each node", "depth": "levels of the tree (fanout**depth requests)",
              "branch_len": "tokens each level adds", "max_tokens": _COMMON["max_tokens"]}),
    Workload("no_sharing", "independent random prompts: the control, nothing to reuse",
             {"num_requests": 32, "prompt_len": [200, 600], "max_tokens": 16},
             _no_sharing,
             {**_COMMON, "prompt_len": "tokens of each prompt"}),
]
