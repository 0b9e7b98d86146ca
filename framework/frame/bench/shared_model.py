"""An EngineCore that reuses an already loaded model between experiment cells.

Building an engine dequantizes and loads every weight (seconds per cell on a small CPU). Cells that differ only
in bookkeeping options (cache, scheduler, block size, pool size, token budget) can share the model and its
attention backend: the KV pool, cache strategy, scheduler and sampler stay per engine, and the attention
backend's per-step metadata is built anew on every step. The sharing key holds everything that shapes
the model or its kernels (checkpoint, model family, platform, attention backend and their options, dtype).
Only one engine may run at a time with a shared model (experiments run cells one after another).
"""

from __future__ import annotations

from typing import Any

from frame.config import EngineConfig
from frame.engine.core.engine_core import EngineCore
from frame.engine.core.executor import Executor
from frame.engine.core.executor.inproc import InProcExecutor
from frame.engine.worker.model_worker import Worker
from frame.interfaces.attention import AttentionBackend
from frame.interfaces.model import CausalLM
from frame.model_source import ModelSource


class LoadedModels:
    """Models loaded so far, by sharing key; ``loads`` counts how many were actually loaded."""

    def __init__(self) -> None:
        self.models: dict[tuple[Any, ...], tuple[Any, Any, Any]] = {}
        self.loads = 0


class SharedModelWorker(Worker):
    """A worker that takes its model from ``models`` when one with the same key is loaded."""

    def __init__(self, config: EngineConfig, max_model_len: int, models: LoadedModels, **kwargs: Any) -> None:
        self._shared = models
        super().__init__(config, max_model_len, **kwargs)

    def _key(self) -> tuple[Any, ...]:
        sel = self.selection
        return (str(self.source.path), self.family, sel.platform_name, sel.attn, str(sel.dtype),
                repr(sel.options.get("platform")), repr(sel.options.get("attention")), repr(self.config.model_options))

    def load_model(self) -> tuple[CausalLM, AttentionBackend]:
        key = self._key()
        if key not in self._shared.models:
            self._shared.models[key] = (*super().load_model(), self.kv_groups)
            self._shared.loads += 1
        model, attention, self.kv_groups = self._shared.models[key]  # the groups come with the model's layers
        return model, attention


class SharedModelEngine(EngineCore):
    """EngineCore whose in-process worker takes the model from ``models`` when one with the same key is loaded."""

    def __init__(self, config: EngineConfig, source: ModelSource, models: LoadedModels) -> None:
        self._shared = models
        super().__init__(config, source=source)

    def _make_executor(self) -> Executor:
        worker = SharedModelWorker(self.config, self.max_model_len, self._shared, registry=self.registry,
                                   source=self.source, selection=self.selection)
        return InProcExecutor(worker)
