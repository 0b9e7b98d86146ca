"""Compiled kernels on a real GPU: bfloat16 (which the interpreter cannot check), larger shapes, long contexts.

Marked ``gpu`` and skipped without a CUDA or ROCm device; ``scripts/gpu_check.sh`` runs them.
"""

from __future__ import annotations

import random

import pytest
import torch
from frame.testing.attention import make_random_batch, reference_attention
from frame_attention_triton.backend import TritonAttentionBackend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm device"),
]

#: Max abs error against the float64 reference, per dtype, for inputs ~N(0, 1).
TOLERANCE = {torch.float32: 5e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _check(seed: int, dtype: torch.dtype, num_seqs: int, block_size: int, heads: tuple[int, int], head_dim: int,
           max_query_len: int, max_context: int) -> None:
    q, k, v, k_cache, v_cache, meta = make_random_batch(
        seed, num_seqs, block_size, heads[0], heads[1], head_dim, dtype, "cuda",
        max_query_len=max_query_len, max_context=max_context,
    )
    expected = reference_attention(q, k, v, k_cache, v_cache, meta, head_dim**-0.5).double()
    backend = TritonAttentionBackend(heads[0], heads[1], head_dim, head_dim**-0.5, dtype)
    out = backend.forward(q, k, v, k_cache, v_cache, backend.build_metadata(meta))
    err = (out.double() - expected).abs().max().item()
    assert err <= TOLERANCE[dtype], f"seed {seed} {dtype} bs={block_size} heads={heads} d={head_dim}: {err:.2e}"


@pytest.mark.parametrize("seed", range(24))
def test_random_batches_on_gpu(seed):
    rng = random.Random(1000 + seed)
    _check(seed, [torch.bfloat16, torch.float16, torch.float32][seed % 3], rng.randint(1, 6),
           rng.choice([16, 32, 64]), rng.choice([(8, 8), (8, 2), (12, 4), (16, 1), (32, 8)]),
           rng.choice([64, 128]), max_query_len=97, max_context=300)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_long_context_decodes_on_gpu(dtype):
    _check(5, dtype, 8, 16, (32, 8), 128, max_query_len=2, max_context=2000)
