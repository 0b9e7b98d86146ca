"""The Triton kernels against a float64 reference: the KV write slot by slot, attention on random mixed batches.

Without a GPU the kernels run under the Triton interpreter (see conftest.py) on small shapes, in float32 and
float16 (the interpreter mishandles bfloat16 tl.dot). Tolerances (max abs error against float64, inputs ~N(0,1)):
float32 5e-6 (the kernel uses IEEE fp32 dots), float16 4e-3 (fp16 inputs, fp16 probabilities in P·V, fp16 output).
"""

from __future__ import annotations

import random

import pytest
import torch
from frame_attention_triton.backend import TritonAttentionBackend
from frame_attention_triton.kv_write import write_kv
from frame_attention_triton.planning import build_plan

TOLERANCE = {torch.float32: 5e-6, torch.float16: 4e-3, torch.bfloat16: 3e-2}
HEAD_LAYOUTS = [(4, 4), (4, 2), (8, 2), (4, 1), (6, 2), (6, 3)]  # (query heads, KV heads): MHA, GQA, MQA, odd groups


def random_config(seed: int, dtypes: tuple[torch.dtype, ...]) -> dict:
    """One seeded configuration: heads, sizes, dtype and a batch mixing prefills, chunks and decodes."""
    rng = random.Random(seed)
    specs: list[tuple[int, int]] = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(["prefill", "chunk", "decode"])
        if kind == "prefill":
            specs.append((0, rng.randint(1, 40)))
        elif kind == "chunk":
            specs.append((rng.randint(1, 48), rng.randint(2, 24)))
        else:
            specs.append((rng.randint(1, 70), 1))
    num_heads, num_kv_heads = rng.choice(HEAD_LAYOUTS)
    return dict(specs=specs, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=rng.choice([64, 128]),
                block_size=rng.choice([16, 32]), dtype=rng.choice(dtypes))


def run_backend(batch, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                prefill_block_m: int | None = None) -> torch.Tensor:
    backend = TritonAttentionBackend(num_heads, num_kv_heads, head_dim, head_dim**-0.5, dtype)
    if prefill_block_m is not None:
        backend.options = backend.options.model_copy(update={"prefill_block_m": prefill_block_m})
    meta = backend.build_metadata(batch.meta)
    return backend.forward(batch.query, batch.key, batch.value, batch.k_cache, batch.v_cache, meta)


@pytest.mark.parametrize("seed", range(56))
def test_attention_matches_reference_on_random_mixed_batches(seed, paged_batch, reference):
    cfg = random_config(seed, (torch.float32, torch.float16))
    batch = paged_batch(cfg["specs"], num_heads=cfg["num_heads"], num_kv_heads=cfg["num_kv_heads"],
                        head_dim=cfg["head_dim"], block_size=cfg["block_size"], dtype=cfg["dtype"], seed=seed)
    out = run_backend(batch, cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"], cfg["dtype"],
                      prefill_block_m=[16, 32, 64][seed % 3])
    expected = reference(batch.query, batch.k_cache, batch.v_cache, batch.meta, cfg["head_dim"] ** -0.5)
    assert out.dtype == cfg["dtype"] and out.shape == batch.query.shape
    err = (out.cpu().double() - expected).abs().max().item()
    assert err <= TOLERANCE[cfg["dtype"]], f"{cfg}: max abs error {err:.2e}"


def test_random_configurations_cover_the_required_space():
    configs = [random_config(seed, (torch.float32, torch.float16)) for seed in range(56)]
    kinds = {("prefill" if c == 0 else "decode" if q == 1 else "chunk") for cfg in configs for c, q in cfg["specs"]}
    assert kinds == {"prefill", "chunk", "decode"}
    assert {cfg["block_size"] for cfg in configs} == {16, 32}
    assert {cfg["head_dim"] for cfg in configs} == {64, 128}
    assert {cfg["dtype"] for cfg in configs} == {torch.float32, torch.float16}
    assert {(cfg["num_heads"], cfg["num_kv_heads"]) for cfg in configs} == set(HEAD_LAYOUTS)
    mixed = [cfg for cfg in configs if len({(c == 0, q == 1) for c, q in cfg["specs"]}) > 1]
    assert len(mixed) >= 20


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kv_write_fills_exactly_the_mapped_slots(dtype):
    gen = torch.Generator().manual_seed(7)
    num_blocks, block_size, num_kv_heads, head_dim = 5, 16, 3, 64
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:23]
    key = torch.randn(23, num_kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(23, num_kv_heads, head_dim, generator=gen).to(dtype)

    write_kv(key, value, k_cache, v_cache, slots)

    written = set(slots.tolist())
    for t, slot in enumerate(slots.tolist()):
        assert torch.equal(k_cache[slot // block_size, slot % block_size], key[t]), f"key of token {t}, slot {slot}"
        assert torch.equal(v_cache[slot // block_size, slot % block_size], value[t]), f"value of token {t}"
    for slot in set(range(num_blocks * block_size)) - written:
        where = (slot // block_size, slot % block_size)
        assert torch.equal(k_cache[where], before_k[where]) and torch.equal(v_cache[where], before_v[where])


def test_kv_write_casts_to_the_cache_dtype():
    k_cache = torch.zeros(2, 16, 1, 64, dtype=torch.float16)
    v_cache = torch.zeros_like(k_cache)
    key = torch.full((1, 1, 64), 1.5)
    write_kv(key, key * 2, k_cache, v_cache, torch.tensor([17]))
    assert torch.equal(k_cache[1, 1], key[0].half()) and torch.equal(v_cache[1, 1], (key[0] * 2).half())


def test_kv_write_rejects_mismatched_shapes():
    cache = torch.zeros(2, 16, 2, 64)
    with pytest.raises(ValueError, match="slot_mapping has 1 slots for 2 keys"):
        write_kv(torch.zeros(2, 2, 64), torch.zeros(2, 2, 64), cache, cache.clone(), torch.tensor([0]))
    with pytest.raises(ValueError, match="the cache holds rows of"):
        write_kv(torch.zeros(1, 3, 64), torch.zeros(1, 3, 64), cache, cache.clone(), torch.tensor([0]))


def test_pure_decode_batch_with_long_contexts(paged_batch, reference):
    batch = paged_batch([(95, 1), (3, 1), (64, 1)], num_heads=8, num_kv_heads=1, head_dim=64, block_size=16,
                        dtype=torch.float32, seed=99)
    out = run_backend(batch, 8, 1, 64, torch.float32)
    expected = reference(batch.query, batch.k_cache, batch.v_cache, batch.meta, 64**-0.5)
    assert (out.double() - expected).abs().max().item() <= TOLERANCE[torch.float32]


def test_attend_on_the_common_metadata_builds_its_own_plan(paged_batch, reference):
    batch = paged_batch([(5, 3), (0, 17)], num_heads=2, num_kv_heads=2, head_dim=64, block_size=16,
                        dtype=torch.float32, seed=3)
    backend = TritonAttentionBackend(2, 2, 64, 0.125, torch.float32)
    out = backend.forward(batch.query, batch.key, batch.value, batch.k_cache, batch.v_cache, batch.meta)
    expected = reference(batch.query, batch.k_cache, batch.v_cache, batch.meta, 0.125)
    assert (out.double() - expected).abs().max().item() <= TOLERANCE[torch.float32]


def test_block_size_must_be_a_multiple_of_16(paged_batch):
    batch = paged_batch([(3, 2)], num_heads=2, num_kv_heads=1, head_dim=64, block_size=8, dtype=torch.float32,
                        seed=1)
    with pytest.raises(ValueError, match="multiple of 16, got 8"):
        run_backend(batch, 2, 1, 64, torch.float32)


def test_plan_tiles_cover_every_query_once():
    plan = build_plan([1, 40, 0, 17], group=2, prefill_block_m=32, device=torch.device("cpu"))
    assert plan.block_q == 16 and plan.block_m == 32
    assert list(zip(plan.tile_seq.tolist(), plan.tile_q0.tolist(), strict=True)) == [
        (0, 0), (1, 0), (1, 16), (1, 32), (3, 0), (3, 16)]
    decode = build_plan([1, 1, 1], group=4, prefill_block_m=64, device=torch.device("cpu"))
    assert decode.block_q == 4 and decode.block_m == 16 and decode.num_tiles == 3
    wide = build_plan([1], group=32, prefill_block_m=64, device=torch.device("cpu"))
    assert wide.block_q == 1 and wide.block_m == 32


def test_backend_refuses_unsupported_dtypes():
    with pytest.raises(ValueError, match="float16, bfloat16 or float32"):
        TritonAttentionBackend(4, 2, 64, 0.125, torch.float64)
