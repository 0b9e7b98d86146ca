"""Multi-turn chat: radix reuses a prefix that ends mid-block, hashchain only its block-aligned part; exact counts."""

from __future__ import annotations

from frame import LLM, SamplingParams
from frame.workloads import load_workloads

BLOCK = 16


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_radix_reuses_mid_block_where_hashchain_stops_at_the_block(smol_source) -> None:
    requests = load_workloads().get("multi_turn").generate(
        smol_source.tokenizer, 3, num_conversations=1, num_turns=4, system_len=21, user_len=[5, 11],
        reply_len=[6, 13], max_tokens=4)
    turns = sorted(requests, key=lambda r: r.wave)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    reused: dict[str, list[int]] = {}
    expected: dict[str, list[int]] = {"hashchain": [], "radix": []}
    for cache in ("hashchain", "radix"):
        llm = LLM(dtype="float32", cache=cache, block_size=BLOCK, max_model_len=256)
        history: list[list[int]] = []  # every sequence the cache has seen: its computed tokens
        reused[cache] = []
        for turn in turns:
            prompt = list(turn.prompt_token_ids)
            out = llm.generate({"prompt_token_ids": prompt}, params)[0]
            reused[cache].append(out.num_cached_tokens)
            # What the cache holds of earlier turns: their prompt and every output token but the last
            # (the last sampled token's KV is never computed).
            best = max((_common_prefix(prompt, seen) for seen in history), default=0)
            best = min(best, len(prompt) - 1)
            expected[cache].append(best if cache == "radix" else best // BLOCK * BLOCK)
            history.append(prompt + out.outputs[0].token_ids[:-1])
    assert reused == expected
    assert any(r % BLOCK for r in reused["radix"]), "the workload must end some prefixes inside a block"
    assert sum(reused["radix"]) > sum(reused["hashchain"])
