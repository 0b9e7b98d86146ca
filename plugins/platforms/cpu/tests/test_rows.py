"""``packed_rows``: the rows of a table kept in ggml's blocks, for the ids looked up, against gguf's own (numpy)
dequantisation, bit for bit, in every format the linears' kernels read; and a step that looks rows up this way is
recorded and replayed.

The blocks are gguf's own quantization where gguf-py writes the type (q4_0, q4_1, q8_0), else random bytes with
sane float16 scales (every bit pattern of a block is a valid block, and gguf's ``dequantize`` says what it means).
The op has one path, plain C++ built for this CPU's class (its products are exact, so whether the compiler fuses
them into FMAs changes no bit); run this file with ``FRAME_CPU_DISABLE=avx512f`` or ``=avx2`` to build and check it
for the lesser classes."""

from __future__ import annotations

import pytest
import torch
from frame.layers import ParallelLMHead, VocabParallelEmbedding, attach_platform_kernels, finish_loading
from frame.layers.quantized import embedding_rows
from frame.testing.ggml_blocks import BLOCK_LAYOUT, random_blocks
from frame.weights import GGMLWeight, MixedRows
from frame_platform_cpu import kernels, rows
from frame_platform_cpu.platform import CpuPlatform
from frame_platform_cpu.record import NotRecordable, record
from frame_platform_cpu.replay import compile_replay
from torch import nn

_WHY_NOT = kernels.unavailable_reason()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"the cpu platform's kernels cannot be built: {_WHY_NOT}")

#: Every format packed_rows reads: gguf-py quantizes the first three, the others are random blocks.
FORMATS = ["q4_0", "q4_1", "q8_0", *BLOCK_LAYOUT]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def bits(values: torch.Tensor) -> torch.Tensor:
    """The values' bit patterns (a -0 is not a +0 here)."""
    return values.view(torch.int32 if values.dtype == torch.float32 else torch.int16)


def table(fmt: str, vocab: int, hidden: int, seed: int = 0) -> GGMLWeight:
    """``vocab`` rows of ``fmt`` blocks: gguf's quantization of random values where gguf-py writes the type, random
    bytes with sane scales otherwise (``frame.testing.ggml_blocks``)."""
    if fmt in BLOCK_LAYOUT:
        return random_blocks(fmt, vocab, hidden, seed)
    return GGMLWeight.quantized(fmt, torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_are_ggufs_dequantisation_bit_for_bit(fmt: str, dtype: torch.dtype) -> None:
    weight = table(fmt, 50, 768 if fmt.endswith("_k") or fmt == "iq4_xs" else 544, seed=len(fmt))
    lookup = rows.packed_rows(weight, dtype)
    assert lookup is not None
    reference = weight.dequantize(dtype)
    ids = torch.tensor([[3, 49, 3], [0, 17, 31]])  # a repeat, the first and the last row
    assert torch.equal(bits(lookup(ids)), bits(reference[ids]))
    assert torch.equal(bits(lookup(ids.int())), bits(reference[ids]))
    assert lookup(torch.tensor([], dtype=torch.int64)).shape == (0, weight.in_features)


def test_the_blocks_are_read_in_place_and_ids_are_checked() -> None:
    weight = table("q4_k", 8, 256)
    lookup = rows.packed_rows(weight, torch.float32)
    before = lookup(torch.tensor([2]))
    weight.tensors["blocks"][2, 16:32] ^= 0x11  # some of row 2's nibbles: no copy was made
    after = lookup(torch.tensor([2]))
    assert not torch.equal(after, before) and torch.equal(after, weight.dequantize()[2:3])
    with pytest.raises(RuntimeError, match="id 8 is outside the table's 8 rows"):
        lookup(torch.tensor([1, 8]))
    assert lookup(torch.tensor([1.0])) is None  # float ids: the layer's reference says what is wrong


def test_formats_and_dtypes_it_does_not_read_are_declined() -> None:
    mixed = MixedRows([table("q4_k", 4, 256), table("q6_k", 4, 256)])
    assert rows.packed_rows(mixed, torch.float32) is None
    assert rows.packed_rows(table("q8_0", 4, 64), torch.float64) is None


def test_a_lookup_is_recorded_where_the_reference_is_not() -> None:
    weight = table("q4_1", 40, 96)
    ids = torch.zeros(3, dtype=torch.int64)  # the runner's fixed buffer, refilled before each replay
    lookup = rows.packed_rows(weight, torch.bfloat16)
    with torch.inference_mode():
        recording, first = record(lambda: lookup(ids) * 2.0)
        assert torch.equal(first, weight.dequantize(torch.bfloat16)[[0, 0, 0]] * 2.0)
        replay = compile_replay(recording)
        for step in ([5, 6, 5], [39, 0, 1]):
            ids.copy_(torch.tensor(step))
            assert torch.equal(replay(), weight.dequantize(torch.bfloat16)[step] * 2.0)
        table_param = nn.Parameter(torch.empty(40, 96, dtype=torch.bfloat16, device="meta"), requires_grad=False)
        table_param.packed = weight
        with pytest.raises(NotRecordable, match="unique"):  # the core's reference: ids read back, numpy
            record(lambda: embedding_rows(ids, table_param))


def test_the_platform_gives_a_packed_table_its_lookup_and_a_tied_head_its_linear() -> None:
    embed = VocabParallelEmbedding(96, 64, torch.device("cpu"), torch.float32)
    head = ParallelLMHead(64, 96, torch.device("cpu"), torch.float32, weight=embed.weight)
    model = nn.ModuleDict({"embed": embed, "head": head})
    weight = GGMLWeight.quantized("q8_0", torch.randn(96, 64, generator=torch.Generator().manual_seed(1)))
    embed.load("weight", weight)
    assert finish_loading(model, None) == 1
    attach_platform_kernels(model, CpuPlatform())
    assert embed.kernel is not None and head.kernel is not None
    ids = torch.tensor([[5, 7, 5], [95, 0, 7]])
    assert torch.equal(embed(ids), weight.dequantize()[ids])
    dense = VocabParallelEmbedding(96, 64, torch.device("cpu"), torch.float32)
    assert CpuPlatform().layer_kernel(dense) is None  # a dense table keeps F.embedding
