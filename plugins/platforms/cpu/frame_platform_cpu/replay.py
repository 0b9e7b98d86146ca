"""Replay a :class:`~frame_platform_cpu.record.Recording`: planned, then as a native program, or as a TorchScript
function where the program cannot express a call.

:func:`compile_replay` plans the recording's intermediates (:mod:`~frame_platform_cpu.plan`) and builds its native
program (:mod:`~frame_platform_cpu.program`). The TorchScript form takes the recording's external tensors as one
list argument and calls the recorded ops in order, ``torch.ops.<namespace>.<op>(...)`` with the recorded
constants; TorchScript's interpreter then runs the step as a loop in C++. Either way the externals are read as they
are at each replay, never folded in: the weights, the KV pool and the refilled input buffers as they are then.
"""

from __future__ import annotations

import keyword
import logging
import math
from collections.abc import Callable
from typing import Any

import torch

from frame_platform_cpu.plan import plan
from frame_platform_cpu.program import build_program
from frame_platform_cpu.record import Call, External, NotRecordable, Recording, Slot, binding, needed_slots

log = logging.getLogger("frame.platform.cpu")

_SIMPLE = (torch.dtype, torch.layout, torch.memory_format)


class _Writer:
    """Writes one function's body, a line per op call (and a typed local per list argument that holds a tensor).

    A list of numbers (sizes and strides: two per view) is built once, at the top of the function, and every call
    that passes the same values passes that list: TorchScript has no list constants, so a list written at its call
    is built anew (allocated and filled) by each replay, 335 of them in a SmolLM2 decode step where these are 10.
    No op the recording holds writes into such an argument (aten's take them as sizes, strides or dims to read).
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.constants: list[str] = []  # the lines building the shared lists, before the body
        self._shared: dict[tuple[str, str], str] = {}
        self._locals = 0

    def local(self, annotation: str, value: str) -> str:
        name = f"a{self._locals}"
        self._locals += 1
        self.lines.append(f"    {name}: {annotation} = {value}")
        return name

    def shared(self, annotation: str, value: str) -> str:
        """The name of the list built once with these contents."""
        key = (annotation, value)
        if key not in self._shared:
            self._shared[key] = name = f"c{len(self._shared)}"
            self.constants.append(f"    {name}: {annotation} = {value}")
        return self._shared[key]

    def value(self, value: Any, schema_type: str) -> str:
        if isinstance(value, Slot):
            return f"t{value.index}"
        if isinstance(value, External):
            return f"ext[{value.index}]"
        if isinstance(value, (list, tuple)):
            annotation = _list_type(value, schema_type)
            if "Tensor" not in annotation and value:
                return self.shared(annotation, f"[{', '.join(self.value(v, '') for v in value)}]")
            return self.local(annotation, f"[{', '.join(self.value(v, '') for v in value)}]")
        if value is None or isinstance(value, (bool, int, str)):
            return repr(value)
        if isinstance(value, float):
            return repr(value) if math.isfinite(value) else f"float('{value}')"
        if isinstance(value, _SIMPLE):
            return str(value)
        if isinstance(value, torch.device):
            return f"torch.device('{value}')"
        raise NotRecordable(f"an argument {value!r} TorchScript cannot spell")


def _list_type(value: list | tuple, schema_type: str) -> str:
    """The TorchScript type of a list argument, from its elements and (for tensors) the op's schema."""
    if any(isinstance(v, (Slot, External)) for v in value) or "Tensor" in schema_type:
        return "List[Optional[Tensor]]" if "Optional[Tensor]" in schema_type else "List[Tensor]"
    if all(isinstance(v, bool) for v in value) and value:
        return "List[bool]"
    if any(isinstance(v, float) for v in value) or "float" in schema_type:
        return "List[float]"
    return "List[int]"


def _call(writer: _Writer, op: Any, args: tuple, kwargs: dict[str, Any]) -> str:
    """``torch.ops.<namespace>.<name>(...)``. TorchScript picks the overload from the arguments, and a dtype is an
    int to it (``view(t, torch.float16)`` would be ``view.default``'s size 5): past the first, the arguments of an
    overload other than the default go by their schema names, which only the recorded overload has."""
    schema = op._schema
    types = {a.name: str(a.type) for a in schema.arguments}
    by_name = schema.overload_name not in ("", "default")
    positional, named = [], {}
    for i, v in enumerate(args):
        arg = schema.arguments[i]
        if not by_name or i == 0:
            positional.append(writer.value(v, str(arg.type)))
        elif arg.name.isidentifier() and not keyword.iskeyword(arg.name):
            named[arg.name] = v
        else:
            raise NotRecordable(f"{schema.name}.{schema.overload_name}'s argument {arg.name!r} cannot be named")
    kwargs = {**named, **kwargs}
    keywords = [f"{k}={writer.value(v, types.get(k, ''))}" for k, v in kwargs.items()]
    namespace, name = schema.name.split("::")
    return f"torch.ops.{namespace}.{name}({', '.join(positional + keywords)})"


def _bind(writer: _Writer, call: Call, number: int, needed: set[int]) -> None:
    """Assign a call's tensors to their slot names. A functional op that returned one of its inputs (``to`` a
    dtype the tensor has) is left out; ``detach`` (in inference, a new handle on the same tensor) is a rename; a
    view op is one ``as_strided`` of its root, and none at all when only other views read it (:func:`binding`)."""
    result, op = call.result, call.op
    how = binding(call, needed)
    if how == "skip":
        return
    if how == "rename":
        writer.lines.append(f"    t{result.index} = {writer.value(call.args[0], 'Tensor')}")
        return
    if how == "view":
        view = call.view
        writer.lines.append(f"    t{result.index} = torch.ops.aten.as_strided({writer.value(view.root, '')}, "
                            f"{writer.value(view.size, 'List[int]')}, {writer.value(view.stride, 'List[int]')}, "
                            f"{view.offset})")
        return
    expression = _call(writer, op, call.args, call.kwargs)
    if isinstance(result, Slot):
        writer.lines.append(f"    t{result.index} = {expression}")
    elif isinstance(result, (list, tuple)) and any(isinstance(r, Slot) for r in result):
        writer.lines.append(f"    r{number} = {expression}")
        for i, r in enumerate(result):
            if isinstance(r, Slot):
                writer.lines.append(f"    t{r.index} = r{number}[{i}]")
    else:
        writer.lines.append(f"    {expression}")


def source(recording: Recording) -> str:
    """TorchScript source of ``step(ext: List[Tensor]) -> Tensor`` repeating ``recording``."""
    if recording.output is None:
        raise NotRecordable("the step has no output")
    writer, needed = _Writer(), needed_slots(recording)
    for number, call in enumerate(recording.calls):
        _bind(writer, call, number, needed)
    writer.lines.append(f"    return {writer.value(recording.output, 'Tensor')}")
    return "def step(ext: List[Tensor]) -> Tensor:\n" + "\n".join(writer.constants + writer.lines) + "\n"


def _script_list(tensors: list[torch.Tensor]) -> Any:
    """``tensors`` as a TorchScript list holding the same tensors (not copies). A Python list passed to the step
    is converted element by element at every call: for SmolLM2's 251 externals that was 0.13 ms of a 7-10 ms
    single-stream token (perf, Zen 4), every tensor's Python object visited cold after the weights had streamed
    through the caches. A ScriptList is handed over as it is."""
    if not tensors:
        return tensors
    try:
        return torch.jit.script(tensors)
    except RuntimeError:  # a torch that cannot script a list: the plain list works, converted per call
        return tensors


def compile_replay(recording: Recording, teams: bool = True) -> Callable[[], torch.Tensor]:
    """A function running ``recording`` again over its external tensors as they are at each call (its
    intermediates planned into fixed buffers where :func:`~frame_platform_cpu.plan.plan` can): the native
    program (:mod:`~frame_platform_cpu.program`; ``teams``: :func:`~frame_platform_cpu.program.build_program`'s), or
    TorchScript where the program cannot express a call."""
    recording = plan(recording)
    try:
        return build_program(recording, teams=teams).run
    except NotRecordable as e:
        log.info("a decode step replays through TorchScript: %s", e)
    return compile_script(recording)


def compile_script(recording: Recording) -> Callable[[], torch.Tensor]:
    """``recording`` (planned already) as a TorchScript function over its external tensors."""
    try:
        unit = torch.jit.CompilationUnit(source(recording))
    except (RuntimeError, AttributeError) as e:  # an op or argument TorchScript cannot express; a torch without it
        raise NotRecordable(f"TorchScript cannot compile the step: {str(e).splitlines()[0]}") from e
    step, externals = unit.step, _script_list(list(recording.externals))

    def replay() -> torch.Tensor:
        # Without the profiling executor's optimisation passes: they would specialise and fuse nothing useful
        # here (every op is a kernel call or a view) and cost a few warm-up runs. A decode step needs no autograd.
        with torch.inference_mode(), torch.jit.optimized_execution(False):
            return step(externals)

    return replay
