"""Plan a recording's intermediates into fixed buffers, so that a replay allocates, frees and views nothing.

Replayed as recorded, a SmolLM2 decode step of one row made about 420 tensors and freed them again: each kernel's
output, each ``empty`` the attention writes into, each slice of the fused QKV projection (an ``as_strided``). Once the
linears have streamed the weights through the caches, every one of those runs cold (malloc, a TensorImpl, the
dispatcher), and perf put them at several percent of the token. A recording already holds the tensors its run made
(:attr:`Recording.made`); this keeps them as buffers of the replay:

- a call to an op with an ``_into`` form (:data:`INTO`) writes into the tensors its recorded run returned;
- an ``empty`` is that run's tensor itself (its contents were never defined);
- a view of such a buffer is that run's view, made once.

Everything else (an op without an ``_into`` form, a view of a tensor still made per replay) runs as recorded. The
step's output may be a buffer too: a replay returns the same tensor every time, as the graph seam says of a CUDA
graph's (:data:`frame.engine.worker.graphs.Replay`), and the runner is done with it before the next. Planning pays
only while a step's intermediates are small, and keeps them alive between steps: a step whose buffers would exceed
:data:`MAX_PLANNED_BYTES` (a large batch bucket, where allocation is a small share anyway) is replayed as recorded.
"""

from __future__ import annotations

from typing import Any

import torch

from frame_platform_cpu.record import Call, External, Recording, Slot

#: The ``_into`` form of each op: the same arguments, then the tensors it would return, written in place.
INTO: dict[str, str] = {
    "frame_cpu::packed_linear": "packed_linear_into",
    "frame_cpu::packed_linear_float": "packed_linear_float_into",
    "frame_cpu::packed_swiglu": "packed_swiglu_into",
    "frame_cpu::add_rms_norm": "add_rms_norm_into",
    "frame_cpu::plain_rms_norm": "plain_rms_norm_into",
    "frame_cpu::ggml_linear_repacked": "ggml_linear_repacked_into",
    "frame_cpu::ggml_swiglu_repacked": "ggml_swiglu_repacked_into",
    "frame_cpu::kquant_linear": "kquant_linear_into",
    "frame_cpu::silu_and_mul": "silu_and_mul_into",
    "frame_cpu::gelu_tanh_and_mul": "gelu_tanh_and_mul_into",
    "frame_cpu::rms_norm": "rms_norm_into",
    "frame_cpu::packed_linear_f32": "packed_linear_f32_into",
}
#: Ops whose ``_into`` form is used only for outputs of these dtypes: the packed float32 linear shares its panels
#: over a team for float32 x, while bfloat16 x (bfloat16-storage weights) is widened first and would run on the
#: team's first thread alone, so it stays the plain op, outside the teams, each call with both threads.
INTO_DTYPES: dict[str, tuple[torch.dtype, ...]] = {"frame_cpu::packed_linear_f32": (torch.float32,)}
#: Allocations whose contents are undefined until written: a planned buffer is one.
EMPTY = frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty"})
#: At most this many bytes of planned buffers per recorded step (SmolLM2: about 0.4 MiB a decode row).
MAX_PLANNED_BYTES = 16 << 20


def _into_op(name: str) -> Any:
    namespace, _ = name.split("::")
    return getattr(getattr(torch.ops, namespace), INTO[name]).default


def _results(result: Any) -> list[Slot] | None:
    """The slots a call returned, when it returned nothing but new slots (one, or a tuple)."""
    values = list(result) if isinstance(result, (list, tuple)) else [result]
    return values if values and all(isinstance(v, Slot) for v in values) else None


def plan(recording: Recording) -> Recording:
    """``recording`` with its intermediates planned into buffers (a new Recording; the argument is unchanged), or
    ``recording`` itself where nothing can be planned or the buffers would be too large."""
    if not recording.made:
        return recording
    externals = list(recording.externals)
    planned: dict[int, External] = {}  # slot index -> the buffer (the recorded run's tensor) as an external

    def buffer(slot: Slot) -> External:
        planned[slot.index] = External(len(externals))
        externals.append(recording.made[slot.index])
        return planned[slot.index]

    def swap(value: Any) -> Any:
        if isinstance(value, Slot) and value.index in planned:
            return planned[value.index]
        if isinstance(value, (list, tuple)):
            return type(value)(swap(v) for v in value)
        return value

    calls: list[Call] = []
    owned = 0  # bytes of the buffers planned calls write (views share theirs)
    for call in recording.calls:
        name = call.op._schema.name
        args, kwargs = swap(call.args), {k: swap(v) for k, v in call.kwargs.items()}
        slots = _results(call.result)
        # Only views of planned buffers: an external's tensor is read as it is at each replay, and a view made once
        # would not follow it if its owner ever pointed it at other storage.
        fixed_root = call.view is not None and isinstance(call.view.root, Slot) and call.view.root.index in planned
        if slots is not None:
            if fixed_root or name in EMPTY:
                buffer(slots[0])
                owned += 0 if fixed_root else recording.made[slots[0].index].untyped_storage().nbytes()
                continue
            dtypes = INTO_DTYPES.get(name)
            if name in INTO and not kwargs and (dtypes is None or recording.made[slots[0].index].dtype in dtypes):
                outs = tuple(buffer(s) for s in slots)
                owned += sum(recording.made[s.index].untyped_storage().nbytes() for s in slots)
                calls.append(Call(_into_op(name), (*args, *outs), {}, None))
                continue
        # An in-place op returns the tensor it wrote, which may be a buffer by now.
        calls.append(Call(call.op, args, kwargs, swap(call.result), call.view))
    if not planned or owned > MAX_PLANNED_BYTES:
        return recording
    return Recording(calls, externals, swap(recording.output))
