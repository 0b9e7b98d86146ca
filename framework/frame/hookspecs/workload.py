"""Hooks of benchmark workload plugins (entry-point group ``frame.workloads``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from frame.hookspecs import hookspec

if TYPE_CHECKING:
    from frame.interfaces.workload import Workload


@hookspec
def frame_workload_list() -> list[Workload]:
    """The benchmark workloads this plugin offers: a list of :class:`frame.interfaces.workload.Workload`.

    Called by the workload catalog (:func:`frame.workloads.load_workloads`) through
    ``PluginHooks.workloads()`` whenever ``frame bench`` (throughput, latency, experiments) or a benchmark script
    needs the workload names, before any engine is built, and by ``frame plugins`` on one plugin to list what it
    offers. Broadcast, not firstresult: every loaded implementer is asked and the lists are concatenated. The
    core's own built-ins (``shared_prefix``, ``multi_turn``, ``few_shot``, ``branching``, ``no_sharing``,
    ``mixed_batch``, ``single_stream``, ``copy_edit``) answer it from the in-process plugin ``workload:builtin``;
    plugins of the entry-point group ``frame.workloads`` answer it too, and a loaded plugin of another kind may.
    ``frame bench --workload NAME`` selects a workload by its ``name``, not by the plugin's. Each name must be
    unique across all answers (a clash is a usage error naming both plugins). Return an empty list to offer none;
    the hook must not build engines or load models, only describe workloads (requests are generated later, from a
    seed and a tokenizer, by ``Workload.generate``). Every workload plugin must implement it (or, deprecated,
    ``frame_workloads``). Since API 2.
    """


@hookspec(warn_on_impl=FutureWarning(
    "frame_workloads is deprecated: rename the hook to frame_workload_list (same arguments, same return); "
    "frame still calls it"))
def frame_workloads() -> list[Workload]:
    """Deprecated alias of :func:`frame_workload_list`, the name this hook had before workloads became a plugin
    kind: same arguments, same answer.

    A plugin written against it keeps working: the catalog asks every implementer of either name, a plugin that
    implements both is asked only through ``frame_workload_list``, and implementing it counts as the workload
    kind's required hook. Registering a plugin that implements it warns (``FutureWarning``) once. Rename it to
    ``frame_workload_list``. Since API 1; deprecated since API 2.
    """
