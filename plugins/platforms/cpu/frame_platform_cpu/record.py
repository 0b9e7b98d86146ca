"""Record one run of a step as the flat list of operator calls that reached torch's dispatcher.

The step is whatever the model family declares in Python (its layers, their kernels, the attention backend); the
recording holds what that Python did once: every top-level aten or custom op (``torch.ops.frame_cpu.*``), its
arguments and which earlier call produced each tensor argument. Tensors the step did not make (weights, packed
panels, the KV pool, the runner's fixed input buffers) are kept by reference, so a replay reads their contents at
replay time, as a CUDA graph reads its static buffers. Python's own decisions (shapes, which kernel applies, loop
bounds) are taken once, which is right exactly when they depend on nothing but the batch shape: what the graph
seam already asks of a step it records. A step that reads a value back to Python (``.item()``), makes a tensor
whose shape depends on data, passes something that cannot be written down (a process group) or makes a tensor
outside torch's ops and drops it (numpy's answer, which a replay would keep) cannot be recorded:
:class:`NotRecordable` says why, and the step then runs eagerly.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Ops whose result is data-dependent on the host side: a step that calls them cannot be replayed.
HOST_READS = frozenset({
    "aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::equal", "aten::nonzero",
    "aten::masked_select", "aten::unique", "aten::_unique2", "aten::unique_consecutive", "aten::sym_size",
    "aten::sym_numel", "aten::sym_stride", "aten::sym_storage_offset",
})


class NotRecordable(RuntimeError):
    """The step did something a recording cannot repeat; the message names the op."""


@dataclass(frozen=True)
class Slot:
    """A tensor the recorded step made: the ``index``-th one."""

    index: int


@dataclass(frozen=True)
class External:
    """A tensor from outside the step (weight, cache, input buffer), the ``index``-th the step read."""

    index: int


@dataclass(frozen=True)
class View:
    """Where a view op's result lies in the tensor that owns the memory (``root``): ``as_strided`` arguments."""

    root: Slot | External
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype  # the root's and the view's (a view as another dtype, view(torch.int8), is not collapsed)


@dataclass(frozen=True)
class Call:
    """One op call: ``op`` (an ``OpOverload``), its arguments with tensors replaced by :class:`Slot` or
    :class:`External`, and what it returned in the same form (new slots for new tensors). ``view``: for a view op
    (a slice, a reshape that copied nothing), its result's place in its root tensor."""

    op: Any
    args: tuple
    kwargs: dict[str, Any]
    result: Any
    view: View | None = None


@dataclass
class Recording:
    """The calls of one step, the external tensors it read (held, so their storage outlives the recording), and
    its output (a :class:`Slot` or :class:`External`)."""

    calls: list[Call] = field(default_factory=list)
    externals: list[torch.Tensor] = field(default_factory=list)
    output: Slot | External | None = None
    #: The tensors the recorded run made, by slot index (what a replay may keep as planned buffers, replay.py).
    made: list[torch.Tensor] = field(default_factory=list)


class _Recorder(TorchDispatchMode):
    """Runs each op as usual and appends it to ``recording``."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in dynamo's disable unless told not to, and the wrapper imports
        # torch._dynamo on its first call: 3-8 s on a 2-core host, paid by the first decode step. A step has
        # nothing for dynamo to compile.
        return False

    def __init__(self) -> None:
        super().__init__()
        self.recording = Recording()
        self._slots: dict[int, Slot] = {}
        self._externals: dict[int, External] = {}
        self._alive: list[torch.Tensor] = []  # keeps ids unique while recording
        self._views: dict[int, View] = {}  # id of a view op's result -> its place in its root

    def ref(self, tensor: torch.Tensor) -> Slot | External:
        key = id(tensor)
        if key in self._slots:
            return self._slots[key]
        if key not in self._externals:
            self._externals[key] = External(len(self.recording.externals))
            self.recording.externals.append(tensor)
        return self._externals[key]

    def _arg(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self.ref(value)
        if isinstance(value, (list, tuple)):
            return type(value)(self._arg(v) for v in value)
        if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                               torch.memory_format)):
            return value
        raise NotRecordable(f"an argument of type {type(value).__name__}")

    def _result(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if id(value) in self._slots or id(value) in self._externals:  # an in-place op returns its input
                return self.ref(value)
            slot = Slot(len(self._slots))
            self._slots[id(value)] = slot
            self._alive.append(value)
            return slot
        if isinstance(value, (list, tuple)):
            return type(value)(self._result(v) for v in value)
        if value is None:
            return None
        raise NotRecordable(f"a result of type {type(value).__name__}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        if name in HOST_READS:
            raise NotRecordable(f"{name} reads a value back to the host")
        rec_args, rec_kwargs = self._arg(args), {k: self._arg(v) for k, v in kwargs.items()}
        out = func(*args, **kwargs)
        result = self._result(out)
        self.recording.calls.append(Call(func, rec_args, rec_kwargs, result, self._view(func, args, out, result)))
        return out

    def _view(self, func: Any, args: tuple, out: Any, result: Any) -> View | None:
        """The place of a view op's result in its root tensor (a view of a view points at the first one's root)."""
        returns = func._schema.returns
        if (len(returns) != 1 or returns[0].alias_info is None or returns[0].alias_info.is_write
                or not isinstance(out, torch.Tensor) or not isinstance(result, Slot) or not args
                or not isinstance(args[0], torch.Tensor) or out is args[0]
                or out.untyped_storage().data_ptr() != args[0].untyped_storage().data_ptr()):
            return None
        parent = self._views.get(id(args[0]))
        root, dtype = (parent.root, parent.dtype) if parent is not None else (self.ref(args[0]), args[0].dtype)
        if out.dtype != dtype:
            return None
        view = View(root, tuple(out.shape), tuple(out.stride()), out.storage_offset(), dtype)
        self._views[id(out)] = view
        return view


def flat(values: Any) -> list:
    """The leaves of nested lists, tuples and dicts (an op's arguments), in order."""
    if isinstance(values, (list, tuple)):
        return [v for value in values for v in flat(value)]
    if isinstance(values, dict):
        return flat(list(values.values()))
    return [values]


def binding(call: Call, needed: set[int]) -> str:
    """How a replay (either form, ``program.py`` or ``replay.py``) takes a recorded call: ``"skip"`` a functional
    op that returned one of its inputs (``to`` a dtype the tensor has) and a view that only other views read,
    ``"rename"`` ``detach`` (in inference, a new handle on the same tensor), ``"view"`` one ``as_strided`` of the
    view's root, ``"call"`` everything else. ``needed``: :func:`needed_slots`."""
    result = call.result
    if (not call.op._schema.is_mutable and isinstance(result, (Slot, External))
            and result in flat((call.args, call.kwargs))):
        return "skip"
    if call.op._schema.name == "aten::detach" and isinstance(result, Slot) and not call.kwargs:
        return "rename"
    if call.view is not None:
        return "view" if result.index in needed else "skip"
    return "call"


def needed_slots(recording: Recording) -> set[int]:
    """Slots that something other than a view reads (a view reads its root, which no view makes): a replay makes a
    view only where one of these is."""
    needed = {recording.output.index} if isinstance(recording.output, Slot) else set()
    for call in recording.calls:
        if call.view is None or call.op._schema.name == "aten::detach":
            needed.update(v.index for v in flat((call.args, call.kwargs)) if isinstance(v, Slot))
    return needed


def record(fn: Callable[[], torch.Tensor]) -> tuple[Recording, torch.Tensor]:
    """Run ``fn`` once, recording it; returns the recording and ``fn``'s output of this run.
    Raises :class:`NotRecordable` where the step cannot be repeated from its recording."""
    recorder = _Recorder()
    with recorder:
        out = fn()
    if not isinstance(out, torch.Tensor):
        raise NotRecordable(f"the step returned {type(out).__name__}, not a tensor")
    recorder.recording.output = recorder.ref(out)
    recorder.recording.made = recorder._alive
    for tensor in recorder.recording.externals:
        # Held by the list, the loop and the call alone: the step made it and dropped it, outside torch's ops
        # (from numpy, say), so a replay would read this run's values forever. A scalar made from a Python number
        # (Gemma's torch.tensor(hidden_size ** 0.5)) is a constant: a number read back from data is a host read.
        if sys.getrefcount(tensor) <= 3 and tensor.dim() > 0:
            raise NotRecordable(f"the step made a {tuple(tensor.shape)} tensor outside torch's ops (from numpy?)")
    return recorder.recording, out
