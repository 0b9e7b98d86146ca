"""Prompt logprobs, scored in the prefill's own forward pass.

A request with ``prompt_logprobs`` set asks, for every prompt position after the first, the logprob of the
prompt's token there and the top alternatives. The logits at position ``p`` score token ``p + 1``, so a step that
computes positions ``[c, c + n)`` of a prompt scores its tokens ``c + 1`` to ``c + n``, the last of which is the
first token of the next prefill chunk (the runner's persistent batch holds the whole prompt). The last prompt
position scores the first output token, which is the sampler's business. Requests that do not ask cost nothing:
their rows are never selected. The lm head runs over the selected hidden rows a chunk at a time, so a long prompt
never holds a ``[prompt, vocab]`` logits tensor at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from frame.engine.wire.plan import PromptLogprobs
from frame.engine.wire.requests import TokenLogprobs
from frame.engine.worker.batch import PersistentBatch
from frame.interfaces.model import CausalLM

#: Hidden rows per lm-head call when scoring a prompt.
_CHUNK = 512


@dataclass
class PromptRows:
    """The step's prompt positions to score: flat-batch rows, the prompt token each scores and its top-k, grouped
    by request (``req_ids[i]`` owns ``counts[i]`` consecutive rows scoring tokens from ``starts[i]`` on)."""

    flat_rows: np.ndarray
    targets: np.ndarray
    top_k: np.ndarray
    req_ids: list[str]
    starts: np.ndarray
    counts: np.ndarray


def take_prompt_rows(batch: PersistentBatch, rows: np.ndarray, counts: np.ndarray,
                     context: np.ndarray) -> PromptRows | None:
    """The prompt positions the step computes for requests that ask for prompt logprobs and have not had them
    reported (a recomputation after preemption reports nothing twice); marks them reported. ``rows``,
    ``counts`` and ``context`` are the step's scheduled rows, new tokens and tokens computed before it."""
    asking = np.flatnonzero(batch.num_prompt_logprobs[rows] >= 0)
    if not len(asking):
        return None
    states = [batch.state_of_row[int(r)] for r in rows[asking]]
    reported = np.asarray([s.next_prompt_logprob for s in states], dtype=np.int64)  # type: ignore[union-attr]
    ctx, new = context[asking], counts[asking]
    low = np.maximum(reported, ctx + 1)
    high = np.minimum(ctx + new + 1, batch.num_prompt_tokens[rows[asking]])
    n = np.maximum(high - low, 0)
    if not n.any():
        return None
    for state, end, size in zip(states, high.tolist(), n.tolist(), strict=True):
        if size:
            state.next_prompt_logprob = end  # type: ignore[union-attr]
    first_flat = (np.cumsum(counts) - counts)[asking] + (low - 1 - ctx)
    offsets = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    positions = np.repeat(low, n) + offsets
    keep = n > 0
    return PromptRows(
        flat_rows=np.repeat(first_flat, n) + offsets,
        targets=batch.token_ids[np.repeat(rows[asking], n), positions].astype(np.int64),
        top_k=np.repeat(batch.num_prompt_logprobs[rows[asking]], n),
        req_ids=[s.req_id for s, k in zip(states, keep.tolist(), strict=True) if k],  # type: ignore[union-attr]
        starts=low[keep], counts=n[keep],
    )


@torch.inference_mode()
def score_prompt(model: CausalLM, hidden: torch.Tensor, prompt: PromptRows) -> list[PromptLogprobs]:
    """Log-softmax (float32) of the lm head over ``prompt``'s hidden rows: each target's logprob, rank and
    top-k."""
    device = hidden.device
    index = torch.from_numpy(prompt.flat_rows).to(device)
    targets = torch.from_numpy(prompt.targets).to(device)
    k_max = int(prompt.top_k.max())
    chosen, ranks, top_values, top_ids = [], [], [], []
    for at in range(0, len(index), _CHUNK):
        logprobs = torch.log_softmax(model.compute_logits(hidden[index[at:at + _CHUNK]]).float(), dim=-1)
        picked = logprobs.gather(1, targets[at:at + _CHUNK].unsqueeze(1))
        chosen.append(picked.squeeze(1))
        ranks.append((logprobs > picked).sum(dim=-1) + 1)
        if k_max:
            values, ids = torch.topk(logprobs, k_max, dim=-1)
            top_values.append(values)
            top_ids.append(ids)
    own, rank = torch.cat(chosen).tolist(), torch.cat(ranks).tolist()
    values_list = torch.cat(top_values).tolist() if k_max else []
    ids_list = torch.cat(top_ids).tolist() if k_max else []
    items = []
    for i, (target, k) in enumerate(zip(prompt.targets.tolist(), prompt.top_k.tolist(), strict=True)):
        top = list(zip(ids_list[i][:k], values_list[i][:k], strict=True)) if k else []
        items.append(TokenLogprobs(target, own[i], top, rank[i]))
    out, at = [], 0
    for req_id, start, count in zip(prompt.req_ids, prompt.starts.tolist(), prompt.counts.tolist(), strict=True):
        out.append(PromptLogprobs(req_id, start, items[at:at + count]))
        at += count
    return out
