"""KV groups: layers grouped by window, and the pool that holds one group's layers per block."""

from __future__ import annotations

import torch
from frame.interfaces.attention import AttentionSpec
from frame.interfaces.kv_groups import KVGroups, window_blocks
from frame.interfaces.kv_layout import KVPool
from frame.interfaces.model import KVCacheSpec


def test_gemma3_layers_make_groups_of_the_global_layers_size() -> None:
    windows = [None if i % 6 == 5 else 512 for i in range(26)]  # Gemma 3 1B: 4 global layers, 22 local
    groups = KVGroups.of(windows, max_model_len=32768)
    assert groups.windows == (None,) + (512,) * 6
    assert groups.layers[0] == (5, 11, 17, 23) and groups.layers[-1] == (24, 25)  # the last local group is short
    assert groups.group_size == 4 and groups.num_layers == 26
    assert [groups.windows[groups.group_of_layer[i]] for i in range(26)] == windows
    # A 32k sequence: 2048 blocks of 4 layers in the full group, a window's worth in each local one.
    assert groups.blocks_per_sequence(32768, 16) == 2048 + 6 * window_blocks(512, 16)
    assert (2048 + 6 * window_blocks(512, 16)) * 4 < 2048 * 26 / 5


def test_one_kind_of_layer_is_one_group() -> None:
    assert KVGroups.of([4096] * 4) == KVGroups.single(4, 4096)  # Mistral: one sliding group
    assert KVGroups.of([None] * 3) == KVGroups.single(3)
    assert KVGroups.of([None, 8192], max_model_len=8192) == KVGroups.single(2)  # a window past the context is full
    assert KVGroups.of([None, 64], shares_kv=True) == KVGroups.single(2)


def test_layers_that_share_kv_keep_one_full_group() -> None:
    spec = AttentionSpec(4, 2, 16, 0.25)
    specs = [spec, AttentionSpec(4, 2, 16, 0.25, sliding_window=64), AttentionSpec(4, 2, 16, 0.25, kv_source=0)]
    assert KVGroups.of_specs(specs) == KVGroups.single(2)
    assert KVGroups.of_specs(specs[:2]).windows == (None, 64)


def test_the_pool_holds_one_groups_layers_per_block() -> None:
    groups = KVGroups.of([64, 64, None, 64, 64, None])  # two full layers: groups of two
    assert groups.layers == ((2, 5), (0, 1), (3, 4))
    pool = KVPool(KVCacheSpec(6, 2, 8), num_blocks=5, block_size=4, dtype=torch.float32, device="cpu",
                  groups=groups, zeroed=True)
    assert pool.tensor.shape == (2, 2, 5, 4, 2, 8)
    pool.caches[3][0][1].fill_(7.0)  # layer 3 is slot 0 of its group, like layers 0 and 2
    assert pool.caches[0][0][1].eq(7.0).all() and pool.caches[2][0][1].eq(7.0).all()
    assert pool.caches[1][0].eq(0).all()
