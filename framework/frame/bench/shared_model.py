"""An EngineCore that reuses an already loaded model between experiment cells.

Building an engine dequantizes and loads every weight (seconds per cell on a small CPU). Cells that differ only
in bookkeeping options (cache, scheduler, block size, pool size, token budget) can share the model and its
attention backend: the KV pool, cache strategy, scheduler and sampler stay per engine, and the attention
backend's per-step state is rebuilt by ``prepare`` on every step. The sharing key holds everything that shapes
the model or its kernels (checkpoint, model family, platform, attention backend and their options, dtype).
Only one engine may run at a time with a shared model (experiments run cells one after another).
"""

from __future__ import annotations

from typing import Any

from frame.config import EngineConfig
from frame.engine.core import EngineCore
from frame.engine.runner import ModelRunner
from frame.model_source import ModelSource


class LoadedModels:
    """Models loaded so far, by sharing key; ``loads`` counts how many were actually loaded."""

    def __init__(self) -> None:
        self.models: dict[tuple[Any, ...], tuple[Any, Any]] = {}
        self.loads = 0


class SharedModelEngine(EngineCore):
    """EngineCore whose runner takes the model from ``models`` when one with the same key is loaded."""

    def __init__(self, config: EngineConfig, source: ModelSource, models: LoadedModels) -> None:
        self._shared = models
        super().__init__(config, source=source)

    def _key(self, family: str) -> tuple[Any, ...]:
        sel = self.selection
        return (str(self.source.path), family, sel.platform_name, sel.attn, str(sel.dtype),
                repr(sel.options.get("platform")), repr(sel.options.get("attention")))

    def _build_runner(self, family: str) -> ModelRunner:
        key = self._key(family)
        if key not in self._shared.models:
            runner = super()._build_runner(family)
            self._shared.models[key] = (runner.model, runner.attention)
            self._shared.loads += 1
            return runner
        model, attention = self._shared.models[key]
        self.selection.platform.set_up()
        return ModelRunner(model, attention, self.selection.platform.device, self.selection.dtype,
                           self.config.block_size, self.config.seed)
