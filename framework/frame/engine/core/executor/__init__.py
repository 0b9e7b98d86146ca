"""Executors: the engine core's one interface to its model workers (in-process, worker processes, Ray actors)."""

from frame.engine.core.executor.base import Executor, WorkerDiedError

__all__ = ["Executor", "WorkerDiedError"]
