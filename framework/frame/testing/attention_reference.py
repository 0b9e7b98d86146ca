"""The attention suite's batch builders and its reference: what every backend is checked against.

:func:`build_metadata` makes exact metadata for given block tables, :func:`make_random_batch` a seeded random batch
mixing prefills, prefill chunks and decodes, :func:`reference_attention` the obviously-correct float64 loop, and
:func:`quantized_kv` / :func:`tolerance` what a backend over a float or int8/fp8 pool must meet. Re-exported by
:mod:`frame.testing.attention`, the public home of all of it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import torch

from frame.interfaces.attention import AttentionMetadata
from frame.interfaces.kv_dtype import dequantize_rows, quantize_rows
from frame.interfaces.kv_layout import sequence_metadata

#: Sequence kinds :func:`make_random_batch` mixes.
KINDS = ("prefill", "chunk", "decode")


def build_metadata(
    context_lens: Sequence[int], query_lens: Sequence[int], block_tables: Sequence[Sequence[int]], block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """Metadata for sequences with ``context_lens`` cached tokens each adding ``query_lens`` new ones.

    ``block_tables[i]`` lists sequence ``i``'s block ids and must cover its ``context + query`` tokens (the
    engine's own builder, :func:`frame.interfaces.kv_layout.sequence_metadata`).
    """
    return sequence_metadata(context_lens, query_lens, block_tables, block_size, device)


def make_random_batch(
    seed: int, num_seqs: int, block_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", kinds: Sequence[str] | None = None,
    max_query_len: int = 19, max_context: int = 45,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A seeded random step: ``(query, key, value, k_cache, v_cache, meta)``.

    Each sequence is a ``prefill`` (no context), a ``chunk`` (context and several new tokens) or a ``decode``
    (context and one new token), drawn at random unless ``kinds`` names them. Blocks are handed out in a random
    order (never contiguous by accident) from a pool with spare blocks; every slot of the caches holds random
    values, so a backend that reads the wrong slot or the padding of a block table gets a wrong answer.
    """
    rng = random.Random(seed)
    kinds = list(kinds) if kinds is not None else [rng.choice(KINDS) for _ in range(num_seqs)]
    if len(kinds) != num_seqs or any(k not in KINDS for k in kinds):
        raise ValueError(f"kinds must be {num_seqs} of {KINDS}, got {kinds}")
    context_lens = [0 if k == "prefill" else rng.randint(1, max_context) for k in kinds]
    query_lens = [1 if k == "decode" else rng.randint(2, max_query_len) for k in kinds]
    return _random_step(context_lens, query_lens, block_size, num_heads, num_kv_heads, head_dim, seed, rng, dtype,
                        device)


def make_batch(
    context_lens: Sequence[int], query_lens: Sequence[int], block_size: int, num_heads: int, num_kv_heads: int,
    head_dim: int, seed: int = 0, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Like :func:`make_random_batch`, for sequences of the given cached and new token counts (long prefills,
    decodes over long contexts, benchmark shapes)."""
    return _random_step(context_lens, query_lens, block_size, num_heads, num_kv_heads, head_dim, seed,
                        random.Random(seed), dtype, device)


def _random_step(
    context_lens: Sequence[int], query_lens: Sequence[int], block_size: int, num_heads: int, num_kv_heads: int,
    head_dim: int, seed: int, rng: random.Random, dtype: torch.dtype, device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Shuffled block tables (with spare blocks) and random Q/K/V and caches for these lengths."""
    needed = [math.ceil((c + q) / block_size) for c, q in zip(context_lens, query_lens, strict=True)]
    blocks = list(range(sum(needed) + 3))
    rng.shuffle(blocks)
    tables, at = [], 0
    for n in needed:
        tables.append(blocks[at : at + n])
        at += n
    meta = build_metadata(context_lens, query_lens, tables, block_size, device)
    gen = torch.Generator().manual_seed(seed)
    tokens = meta.num_tokens

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    cache_shape = (len(blocks), block_size, num_kv_heads, head_dim)
    return (rand(tokens, num_heads, head_dim), rand(tokens, num_kv_heads, head_dim),
            rand(tokens, num_kv_heads, head_dim), rand(*cache_shape), rand(*cache_shape), meta)


def reference_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: AttentionMetadata, scale: float, sliding_window: int | None = None, logit_softcap: float | None = None,
) -> torch.Tensor:
    """Obviously-correct paged causal attention, one sequence and one query token at a time, in float64.

    Cached context (positions before this step) is read from the caches through the block table; the step's own
    keys and values come from ``key``/``value``, not from the caches. With ``sliding_window`` ``W`` a query at
    position ``p`` sees keys ``(p - W, p]``; with ``logit_softcap`` ``c`` scores become ``c * tanh(score / c)``.
    Returns ``query``'s shape and dtype.
    """
    num_heads, num_kv_heads = query.shape[1], key.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty(query.shape, dtype=torch.float64)
    tables = meta.block_tables.cpu().tolist()
    row = 0
    for i, (q_len, s_len) in enumerate(zip(meta.query_lens, meta.seq_lens_host, strict=True)):
        context = s_len - q_len
        slots = [tables[i][p // meta.block_size] * meta.block_size + p % meta.block_size for p in range(context)]
        cached_k = k_cache.reshape(-1, num_kv_heads, k_cache.shape[-1])[slots].double().cpu()
        cached_v = v_cache.reshape(-1, num_kv_heads, v_cache.shape[-1])[slots].double().cpu()
        keys = torch.cat([cached_k, key[row : row + q_len].double().cpu()])
        values = torch.cat([cached_v, value[row : row + q_len].double().cpu()])
        for j in range(q_len):
            end = context + j + 1
            first = 0 if sliding_window is None else max(0, end - sliding_window)
            for h in range(num_heads):
                scores = keys[first:end, h // group] @ query[row + j, h].double().cpu() * scale
                if logit_softcap is not None:
                    scores = logit_softcap * torch.tanh(scores / logit_softcap)
                out[row + j, h] = torch.softmax(scores, dim=0) @ values[first:end, h // group]
        row += q_len
    return out.to(device=query.device, dtype=query.dtype)


def quantized_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 kv_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float step's caches as a pool of ``kv_dtype`` stores them, and the new K/V as the backend will read them
    back (quantized and dequantized): ``(key, value, k_cache, v_cache)``. Attention over these in floats is what a
    quantized backend must compute up to float rounding; the float step itself it meets within
    :func:`quantized_tolerance`."""
    caches = [quantize_rows(c, kv_dtype) for c in (k_cache, v_cache)]
    rounded = [dequantize_rows(quantize_rows(x, kv_dtype), x.dtype) for x in (key, value)]
    return rounded[0], rounded[1], caches[0], caches[1]


#: How far attention over an int8 / fp8 KV cache may stray from the same attention over the float KV (inputs of
#: unit variance), beyond the compute dtype's own :func:`tolerance`: int8 rows keep about 1/254 of each row's
#: range, fp8 e4m3 three mantissa bits (1/16).
QUANTIZED_TOLERANCE = {torch.int8: 3e-2, torch.float8_e4m3fn: 0.15}


def quantized_tolerance(kv_dtype: torch.dtype, dtype: torch.dtype) -> dict[str, float]:
    """``assert_close`` tolerances of attention over a ``kv_dtype`` cache computed in ``dtype`` against the same
    attention over the float KV."""
    return {key: value + QUANTIZED_TOLERANCE[kv_dtype] for key, value in tolerance(dtype).items()}


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """``torch.testing.assert_close`` tolerances for a backend computing in ``dtype``."""
    if dtype == torch.float32:
        return {"atol": 2e-5, "rtol": 1e-4}
    return {"atol": 2e-2, "rtol": 2e-2}
