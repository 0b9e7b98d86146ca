"""KV groups: the layers whose KV shares one block table, by attention type (full, or a sliding window of W).

A model whose layers all attend alike has one group, and every request one block table, as always. A model that
mixes full and sliding-window layers (Gemma 2/3: local layers beside global ones) gets several: the layers of each
type are cut into groups of ``group_size`` layers, the size of the smallest type, and each group has its own block
table per request, as vLLM's hybrid KV cache manager does (its ``KVCacheGroupSpec``). The pool holds
``group_size`` layers per block, and a block id belongs to one group at a time; layer ``i``'s KV is the pool's layer
slot ``slot_of_layer[i]`` in the blocks of group ``group_of_layer[i]``. A full-attention group keeps every block of
a request; a sliding group gives back (or never claims) the blocks wholly before its window, so a long Gemma 3
prompt costs about one sixth of what keeping every layer's KV would. A model where every layer has the same window
(Mistral) is one sliding group.

No torch here: the engine core reads the windows to drive the cache strategy, the worker the layout to build the
pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["KVGroups", "window_blocks"]


def window_blocks(window: int, block_size: int) -> int:
    """The most blocks a sequence of a group with ``window`` holds once it is past the window: the blocks that
    positions ``[p - window, p]`` can touch."""
    return window // block_size + 2


@dataclass(frozen=True)
class KVGroups:
    """The KV groups of a model's cache layers (the layers that own a KV cache, in order).

    ``windows[g]``: group ``g``'s sliding window (None: full attention); full groups come first.
    ``layers[g]``: the cache layers in group ``g`` (at most ``group_size``).
    """

    windows: tuple[int | None, ...]
    layers: tuple[tuple[int, ...], ...]

    @classmethod
    def single(cls, num_layers: int, window: int | None = None) -> KVGroups:
        """Every layer in one group: one block table per request."""
        return cls((window,), (tuple(range(num_layers)),))

    @classmethod
    def of(cls, windows: Sequence[int | None], max_model_len: int | None = None,
           shares_kv: bool = False) -> KVGroups:
        """The groups for cache layers with ``windows`` (None: full attention). A window that covers
        ``max_model_len`` is full attention. ``shares_kv``: some layer reads another's cache (possibly through
        another window), so every layer stays in one group that keeps every block."""
        if max_model_len is not None:
            windows = [None if w is not None and w >= max_model_len else w for w in windows]
        kinds = sorted(set(windows), key=lambda w: -1 if w is None else w)
        if shares_kv or not windows:
            return cls.single(len(windows))
        if len(kinds) == 1:
            return cls.single(len(windows), kinds[0])
        by_kind = {kind: [i for i, w in enumerate(windows) if w == kind] for kind in kinds}
        size = min(len(layers) for layers in by_kind.values())
        groups: list[tuple[int | None, tuple[int, ...]]] = []
        for kind in kinds:
            layers = by_kind[kind]
            groups += [(kind, tuple(layers[i:i + size])) for i in range(0, len(layers), size)]
        return cls(tuple(w for w, _ in groups), tuple(ls for _, ls in groups))

    @classmethod
    def of_specs(cls, specs: Sequence[object], max_model_len: int | None = None) -> KVGroups:
        """The groups of a model's per-layer ``AttentionSpec`` s (:mod:`frame.interfaces.attention`): its cache
        layers are those without a ``kv_source``."""
        own = [s for s in specs if getattr(s, "kv_source", None) is None]
        return cls.of([getattr(s, "sliding_window", None) for s in own], max_model_len,
                      shares_kv=len(own) < len(specs))

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def group_size(self) -> int:
        """Layers one block holds: the largest group."""
        return max(len(layers) for layers in self.layers)

    @property
    def num_layers(self) -> int:
        return sum(len(layers) for layers in self.layers)

    @property
    def group_of_layer(self) -> list[int]:
        """For each cache layer, its group."""
        found = [0] * self.num_layers
        for g, layers in enumerate(self.layers):
            for layer in layers:
                found[layer] = g
        return found

    @property
    def slot_of_layer(self) -> list[int]:
        """For each cache layer, its layer slot in the pool's blocks."""
        found = [0] * self.num_layers
        for layers in self.layers:
            for slot, layer in enumerate(layers):
                found[layer] = slot
        return found

    def blocks_per_sequence(self, num_tokens: int, block_size: int, step_tokens: int = 0) -> int:
        """Blocks one sequence of ``num_tokens`` tokens holds at most, over every group, when a step computes up
        to ``step_tokens`` of them (a windowed group holds a whole prefill chunk while it runs)."""
        full = -(-num_tokens // block_size)
        step = -(-step_tokens // block_size)
        return sum(full if w is None else min(full, window_blocks(w, block_size) + step) for w in self.windows)

    def describe(self) -> str:
        """One line for the start-up log: ``2 KV groups: full x1 layers, window 64 x1 layers``."""
        parts = [f"{'full' if w is None else f'window {w}'} ({len(ls)} layers)"
                 for w, ls in zip(self.windows, self.layers, strict=True)]
        return f"{self.num_groups} KV group{'s' if self.num_groups > 1 else ''}: {', '.join(parts)}"
