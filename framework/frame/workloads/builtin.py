"""The built-in workloads, offered through ``frame_workload_list`` like any plugin's (as ``workload:builtin``)."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.workload import Workload
from frame.version import API_VERSION
from frame.workloads.batch import BATCH_WORKLOADS
from frame.workloads.editing import EDITING_WORKLOADS
from frame.workloads.sharing import SHARING_WORKLOADS

FRAME_API_VERSION = API_VERSION


@hookimpl
def frame_workload_list() -> list[Workload]:
    return [*SHARING_WORKLOADS, *BATCH_WORKLOADS, *EDITING_WORKLOADS]
