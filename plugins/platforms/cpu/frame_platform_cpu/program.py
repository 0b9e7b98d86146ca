"""Build a native :class:`StepProgram <frame_cpu.StepProgram>` (``csrc/step_program.cpp``) from a recording.

The program is the recording's op calls in order, run by one C++ loop: the platform's own kernels with a direct
form (``csrc/direct_ops.h``: the planned linears, SwiGLU, ``add_rms_norm``, rotary) called as functions, every other
op (aten's, the attention backend's) through the dispatcher. Against TorchScript's interpreter a step skips the
interpreter's instructions, the loads of its external tensors from a list, and for the direct kernels the
dispatcher's argument stack and kernel lookup.

The external tensors are the program's constants, held by it, and read as they are at each run (as the
TorchScript replay reads the list it is given); the tensors a call makes live in slots until the run ends. The
binding rules are the TorchScript replay's, one function for both (:func:`~frame_platform_cpu.record.binding`): an
op that returned its input is left out, ``detach`` is a copy of the handle, a view is one ``as_strided`` of its
root where a non-view reads it.

A stretch of direct calls with two or more anchors among them (``csrc/direct_ops.h``'s ``Stretch``: a layer's
linears, with its norms and rotary) runs in one parallel region, the threads meeting at a spin barrier after each
call, rather than each kernel opening its own (``teams``, the platform's ``step_teams`` option). An op of another
library that offers a team form (``frame/team_form.h``: the cpu_paged attention's ``forward``) joins the stretch and
runs on its threads, so a decode step is one region (``set_team_forms(False)`` on the program leaves them out).
"""

from __future__ import annotations

from typing import Any

import torch

from frame_platform_cpu import kernels
from frame_platform_cpu.record import Call, External, NotRecordable, Recording, Slot, binding, flat, needed_slots


def _positional(call: Call, args: tuple, kwargs: dict[str, Any]) -> list:
    """Every argument of the call in schema order: a boxed call takes them all, defaults included."""
    values = []
    for i, argument in enumerate(call.op._schema.arguments):
        if i < len(args):
            values.append(args[i])
        elif argument.name in kwargs:
            values.append(kwargs[argument.name])
        elif argument.has_default_value():
            values.append(argument.default_value)
        else:
            raise NotRecordable(f"{call.op._schema.name} has no value for its argument {argument.name!r}")
    return values


class _Builder:
    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        made = [v.index for call in recording.calls for v in flat(call.result) if isinstance(v, Slot)]
        # Slots past the step's own tensors hold the argument lists built at run time (make_list), one per list.
        lists = sum(isinstance(v, (list, tuple)) and any(isinstance(e, Slot) for e in v)
                    for call in recording.calls for v in (*call.args, *call.kwargs.values()))
        self.next_list = max(made, default=-1) + 1
        self.program = torch.classes.frame_cpu.StepProgram(self.next_list + lists)

    def operand(self, value: Any, schema_type: str = "") -> tuple[Any, int]:
        """``value`` as the program reads it: (a constant, -1), or (None, the slot it lies in)."""
        if isinstance(value, Slot):
            return None, value.index
        if isinstance(value, External):
            return self.recording.externals[value.index], -1
        if isinstance(value, (list, tuple)):
            if any(isinstance(v, Slot) for v in value):  # built by the run, into a slot of its own
                constants, reads = zip(*map(self.operand, value), strict=True)
                slot, self.next_list = self.next_list, self.next_list + 1
                self.program.make_list(list(constants), list(reads), slot, "Optional" in schema_type)
                return None, slot
            return [self.operand(v)[0] for v in value], -1
        return value, -1

    def call(self, op: Any, values: list, writes: list[int]) -> None:
        types = [str(argument.type) for argument in op._schema.arguments]
        operands = [self.operand(v, t) for v, t in zip(values, types, strict=False)]
        constants, reads = [c for c, _ in operands], [r for _, r in operands]
        schema = op._schema
        try:
            self.program.call(schema.name, schema.overload_name, constants, reads, writes)
        except RuntimeError as e:  # an argument the program cannot hold (a memory format)
            raise NotRecordable(f"the native program cannot call {schema.name}: {str(e).splitlines()[0]}") from e

    def bind(self, call: Call, needed: set[int]) -> None:
        result, how = call.result, binding(call, needed)
        if how == "skip":
            return
        if how == "rename":
            value, slot = self.operand(call.args[0])
            self.program.copy(value, slot, result.index)
            return
        if how == "view":
            view = call.view
            self.call(torch.ops.aten.as_strided.default, [view.root, list(view.size), list(view.stride), view.offset],
                      [result.index])
            return
        results = list(result) if isinstance(result, (list, tuple)) else [] if result is None else [result]
        writes = [r.index if isinstance(r, Slot) else -1 for r in results]
        while writes and writes[-1] == -1:
            writes.pop()
        self.call(call.op, _positional(call, call.args, call.kwargs), writes)


def build_program(recording: Recording, teams: bool = True) -> Any:
    """A ``frame_cpu.StepProgram`` that runs ``recording``; :class:`NotRecordable` where one cannot express it.
    ``teams``: run each stretch of direct calls holding two or more anchors (linears) in one parallel region, the
    threads meeting at a spin barrier after each call (``csrc/step_program.cpp``); off, each kernel opens its own."""
    if recording.output is None:
        raise NotRecordable("the step has no output")
    kernels.load()
    builder, needed = _Builder(recording), needed_slots(recording)
    for call in recording.calls:
        builder.bind(call, needed)
    value, slot = builder.operand(recording.output)
    builder.program.set_output(value, slot)
    builder.program.set_teams(teams)
    return builder.program
