"""Hooks that contribute benchmark workloads (``frame bench``). Any plugin may implement them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from frame.hookspecs import hookspec

if TYPE_CHECKING:
    from frame.workloads.base import Workload


@hookspec
def frame_workloads() -> list[Workload]:
    """The benchmark workloads this plugin offers: a list of :class:`frame.workloads.Workload`.

    Called by the workload catalog (:func:`frame.workloads.load_workloads`) through
    ``PluginHooks.workloads()`` whenever ``frame bench`` (throughput, latency, experiments) or a benchmark script
    needs the workload names, before any engine is built. Every implementer is called (broadcast, not
    firstresult) and the lists are concatenated: the core's own built-ins (``shared_prefix``, ``multi_turn``,
    ``few_shot``, ``branching``, ``no_sharing``, ``mixed_batch``, ``single_stream``) answer this same hook from
    the in-process plugin ``workload:builtin``; plugins from the entry-point group ``frame.workloads`` and any
    loaded plugin of another kind may add more. Each workload's ``name`` must be unique across all answers (a
    clash is a usage error naming both providers). Return an empty list to offer none; the hook must not build
    engines or load models, only describe workloads (requests are generated later, from a seed and a
    tokenizer, by ``Workload.generate``). Since API 1.
    """
