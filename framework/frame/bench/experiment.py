"""Config-driven experiments: a matrix of engine options × workloads, every cell on the same seeded requests.

An experiment file (YAML) looks like::

    name: cache_strategies
    seed: 0
    engine: {dtype: float32, num_kv_blocks: 128}     # held fixed in every cell
    matrix: {cache: [hashchain, radix], sched: [fcfs, lpm]}  # every combination
    workloads:
      - shared_prefix                                 # default sizes
      - {name: multi_turn, params: {num_conversations: 4}}

Each cell builds a fresh engine (a cold prefix cache, fresh counters) from one shared, already opened
ModelSource and, where the cell changes nothing that shapes the model, the already loaded model
(:mod:`frame.bench.shared_model`); it warms the engine up with one tiny request, clears the cache and runs
the workload. A cell that fails (an unknown plugin, a pool too small) records its error and the remaining
cells still run.
"""

from __future__ import annotations

import gc
import itertools
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from frame.bench.driver import drive, warm_up
from frame.bench.shared_model import LoadedModels, SharedModelEngine
from frame.config import EngineConfig, build_config, config_error, load_yaml
from frame.engine.client.sync import DataParallelEngine
from frame.engine.core.engine_core import EngineCore
from frame.interfaces.workload import WorkloadRequest
from frame.model_source import ModelSource
from frame.workloads import WorkloadCatalog, load_workloads


class WorkloadSpec(BaseModel):
    """One workload of an experiment, with its size parameters."""

    model_config = ConfigDict(extra="forbid")
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class ExperimentSpec(BaseModel):
    """An experiment file: fixed engine settings, a matrix of varied ones, and the workloads."""

    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    seed: int = 0
    engine: dict[str, Any] = Field(default_factory=dict)
    matrix: dict[str, list[Any]] = Field(default_factory=dict)
    workloads: list[WorkloadSpec]

    @field_validator("workloads", mode="before")
    @classmethod
    def _names_are_specs(cls, value: Any) -> Any:
        return [{"name": v} if isinstance(v, str) else v for v in value] if isinstance(value, list) else value

    @field_validator("matrix")
    @classmethod
    def _matrix_keys_are_engine_keys(cls, value: dict[str, list[Any]]) -> dict[str, list[Any]]:
        unknown = [k for k in value if k not in EngineConfig.model_fields]
        if unknown:
            raise ValueError(f"unknown engine key(s) {unknown}; valid: {', '.join(EngineConfig.model_fields)}")
        return value

    def cells(self) -> list[dict[str, Any]]:
        """Every combination of the matrix values (one empty combination for no matrix)."""
        keys = list(self.matrix)
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*self.matrix.values())]


def load_experiment(path: str | Path) -> ExperimentSpec:
    try:
        return ExperimentSpec(**load_yaml(path))
    except ValidationError as err:
        raise config_error(err, ExperimentSpec, where="experiment") from None


def cell_label(options: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in options.items()) or "default"


class ExperimentRunner:
    """Runs the cells of one experiment; sources and generated requests are shared between cells."""

    def __init__(self, spec: ExperimentSpec, catalog: WorkloadCatalog | None = None) -> None:
        self.spec = spec
        self.catalog = catalog or load_workloads()
        self._sources: dict[tuple[Any, ...], ModelSource] = {}
        self._requests: dict[tuple[Any, ...], list[WorkloadRequest]] = {}
        self.models = LoadedModels()
        for w in spec.workloads:  # unknown workload names fail before any engine is built
            self.catalog.get(w.name)

    def plan(self) -> list[tuple[dict[str, Any], WorkloadSpec]]:
        return [(options, w) for options in self.spec.cells() for w in self.spec.workloads]

    def _source(self, config: EngineConfig) -> ModelSource:
        key = (config.model, config.tokenizer, config.trust_remote_code)
        if key not in self._sources:
            self._sources[key] = ModelSource.open(*key)
        return self._sources[key]

    def requests(self, workload: WorkloadSpec, source: ModelSource) -> list[WorkloadRequest]:
        key = (workload.name, repr(sorted(workload.params.items())), source.path)
        if key not in self._requests:
            self._requests[key] = self.catalog.get(workload.name).generate(source.tokenizer, self.spec.seed,
                                                                           **workload.params)
        return self._requests[key]

    def run_cell(self, options: dict[str, Any], workload: WorkloadSpec,
                 on_tokens: Callable[[int], None] | None = None) -> dict[str, Any]:
        """One cell's row: its options, workload and metrics, or its error."""
        row: dict[str, Any] = {"experiment": self.spec.name, "workload": workload.name, "label": cell_label(options),
                               **{f"opt_{k}": v for k, v in options.items()}, "error": None}
        engine: EngineCore | DataParallelEngine | None = None
        try:
            config = build_config(self.spec.engine, **options)
            source = self._source(config)
            requests = self.requests(workload, source)
            started = time.perf_counter()
            if config.data_parallel_size > 1:  # the cores run in parallel, each in a process of its own
                engine = DataParallelEngine(config, source)
            else:
                engine = SharedModelEngine(config, source, self.models)
            row["build_s"] = time.perf_counter() - started
            warm_up(engine)
            engine.reset_prefix_cache()
            routed_before = engine.routed() if isinstance(engine, DataParallelEngine) else []
            row.update(drive(engine, requests, on_tokens).summary())
            if isinstance(engine, DataParallelEngine):
                row["routed"] = [after - before for after, before in zip(engine.routed(), routed_before, strict=True)]
        except Exception as err:  # a failing cell is a result, not the end of the experiment
            row["error"] = f"{type(err).__name__}: {err}".splitlines()[0]
            row["traceback"] = traceback.format_exc(limit=4)
        finally:
            if engine is not None:
                engine.shutdown()
            del engine
            gc.collect()
        return row
