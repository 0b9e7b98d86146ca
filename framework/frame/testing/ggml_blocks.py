"""Random GGML weights for kernel tests: random bytes in a type's blocks, with float16 scales kept in range.

Random bytes make every quant value and sign pattern appear; only the scales need care, since a random float16
could be huge, NaN or infinite. A kernel test compares a platform's product on these blocks with the
dequantised reference (``GGMLWeight.dequantize``) or with llama.cpp's own arithmetic.
"""

from __future__ import annotations

import torch

from frame.weights import GGMLWeight

#: Per type: (values per block, bytes per block, where its float16 scales sit as (start byte, count, signed)).
BLOCK_LAYOUT: dict[str, tuple[int, int, list[tuple[int, int, bool]]]] = {
    "q5_0": (32, 22, [(0, 1, True)]),
    "q5_1": (32, 24, [(0, 1, False), (2, 1, True)]),  # d, then m (a signed offset)
    "iq4_nl": (32, 18, [(0, 1, True)]),
    "q2_k": (256, 84, [(80, 2, False)]),  # d, dmin after scales and values
    "q3_k": (256, 110, [(108, 1, True)]),
    "q4_k": (256, 144, [(0, 2, False)]),
    "q5_k": (256, 176, [(0, 2, False)]),
    "q6_k": (256, 210, [(208, 1, True)]),
    "iq4_xs": (256, 136, [(0, 1, True)]),
}
#: The largest float16 scale :func:`random_blocks` writes (the smallest is 0.0005).
MAX_SCALE = 0.0045


def random_blocks(fmt: str, rows: int, inputs: int, seed: int = 0) -> GGMLWeight:
    """A ``rows x inputs`` weight of random bytes in ``fmt``'s blocks, but for float16 scales drawn from
    [0.0005, 0.0045] (signed where ggml's scale may be negative)."""
    per, size, scales = BLOCK_LAYOUT[fmt]
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (rows, inputs // per, size), generator=gen, dtype=torch.uint8)
    for start, count, signed in scales:
        scale = torch.rand(rows, inputs // per, count, generator=gen) * (MAX_SCALE - 0.0005) + 0.0005
        if signed:
            scale = scale * (torch.randint(0, 2, scale.shape, generator=gen) * 2 - 1)
        blocks[..., start : start + 2 * count] = scale.half().view(torch.uint8)
    return GGMLWeight(fmt, blocks.reshape(rows, -1), inputs)
