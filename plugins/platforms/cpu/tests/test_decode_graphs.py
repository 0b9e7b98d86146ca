"""The cpu platform's recorded steps: recording what a step's Python dispatched, replaying it as a native program
(or through TorchScript where the program cannot express a call).

A tiny block made of ``frame.layers`` (with the platform's kernels attached where the CPU has them) stands in for
a decode step; the engine-level check, greedy tokens of the bundled model with and without replay, is
tests/e2e/test_decode_graphs.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from frame.layers import Linear, RMSNorm, RotateHalves, SiluAndMul, attach_platform_kernels
from frame_platform_cpu import kernels, probe
from frame_platform_cpu import plan as planning
from frame_platform_cpu.graphs import RecordedStep
from frame_platform_cpu.platform import CpuOptions, CpuPlatform
from frame_platform_cpu.program import build_program
from frame_platform_cpu.record import External, NotRecordable, Recording, Slot, record
from frame_platform_cpu.replay import compile_replay, compile_script, source
from torch import nn

_WHY_NOT = kernels.unavailable_reason()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"the cpu platform's kernels cannot be built: {_WHY_NOT}")


class Block(nn.Module):
    """norm -> linear -> rotary on the first half -> activation -> linear, with a residual: the kinds of calls a
    decoder layer makes (views, in-place kernels, tuple results, dtype conversions)."""

    def __init__(self, dtype: torch.dtype, hidden: int = 64) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden, 1e-5, torch.device("cpu"), dtype)
        self.up = Linear(hidden, 4 * hidden, False, torch.device("cpu"), dtype)
        self.act, self.rotate = SiluAndMul(), RotateHalves()
        self.down = Linear(2 * hidden, hidden, False, torch.device("cpu"), dtype)
        gen = torch.Generator().manual_seed(0)
        for p in self.parameters():
            p.data.copy_(torch.randn(p.shape, generator=gen) * 0.1)

    def forward(self, x: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h, residual = self.norm(x, residual)
        up = self.up(h)
        self.rotate(up[:, :64].view(x.shape[0], 2, 32), cos, sin)
        return self.down(self.act(up)).float() + residual.float()


def _block_step(dtype: torch.dtype, rows: int,
                ) -> tuple[Callable[[], torch.Tensor], Callable[[int], None], torch.Tensor]:
    """A Block on the platform's kernels over fixed input buffers: its step, a refill of the buffers from a seed (as
    the runner refills its own before each replay) and the first buffer."""
    block = Block(dtype)
    attach_platform_kernels(block, CpuPlatform())
    x, residual = torch.empty(rows, 64, dtype=dtype), torch.empty(rows, 64, dtype=dtype)
    cos, sin = torch.empty(rows, 1, 16, dtype=dtype), torch.empty(rows, 1, 16, dtype=dtype)

    def refill(seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        for buffer in (x, residual, cos, sin):
            buffer.copy_(torch.randn(buffer.shape, generator=gen))

    return (lambda: block(x, residual, cos, sin)), refill, x


def _recorded_block(dtype: torch.dtype, rows: int,
                    ) -> tuple[Callable[[], torch.Tensor], Callable[[int], None], Recording]:
    """:func:`_block_step`'s step and refill, and a recording of the step over the buffers refilled from seed 1."""
    step, refill, _ = _block_step(dtype, rows)
    with torch.inference_mode():
        refill(1)
        recording, _ = record(step)
    return step, refill, recording


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5])
def test_a_replay_reads_its_inputs_afresh_and_equals_the_eager_step_bitwise(dtype: torch.dtype, rows: int) -> None:
    step, refill, x = _block_step(dtype, rows)
    with torch.inference_mode():
        refill(1)
        recording, first = record(step)
        replay = compile_replay(recording)
        assert torch.equal(replay(), first)
        for seed in (2, 3):
            refill(seed)  # the runner refills its fixed buffers in place before each replay
            assert torch.equal(replay(), step())
    assert any(t is x for t in recording.externals)  # held by reference, never copied
    # The rotary's slice-then-view is one as_strided of the linear's output, through which the kernel writes.
    code = source(recording)
    assert "torch.ops.aten.as_strided(" in code and "torch.ops.aten.slice(" not in code


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_native_program_and_torchscript_replay_the_same_step_bitwise(dtype: torch.dtype) -> None:
    step, refill, recording = _recorded_block(dtype, 3)
    with torch.inference_mode():
        planned = planning.plan(recording)
        program, script = build_program(planned), compile_script(planned)
        for seed in (2, 3):
            refill(seed)
            expected = step()
            assert torch.equal(program.run(), expected) and torch.equal(script(), expected)
    # The platform's kernels with a direct form skip the dispatcher: every planned linear, norm, activation and
    # rotary.
    direct = {"frame_cpu::packed_linear_into", "frame_cpu::packed_linear_float_into", "frame_cpu::packed_swiglu_into",
              "frame_cpu::add_rms_norm_into", "frame_cpu::rotate_halves_", "frame_cpu::silu_and_mul_into",
              "frame_cpu::packed_linear_f32_into"}
    assert program.num_direct() == sum(call.op._schema.name in direct for call in planned.calls)
    assert 0 < program.num_calls() <= len(planned.calls)


def test_the_program_gives_numbers_and_index_lists_the_types_the_ops_declare() -> None:
    x, rows = torch.randn(6, 4), torch.tensor([4, 1])

    def step() -> torch.Tensor:  # aten::mul.Tensor with a float for its Tensor; aten::index with Tensor?[]
        return x[rows] * 2.0 + 1

    replay = RecordedStep(step)
    for index in ([4, 1], [0, 5]):
        rows.copy_(torch.tensor(index))
        assert torch.equal(replay(), x[rows] * 2.0 + 1)
        assert replay().dtype == torch.float32  # the wrapped numbers promote as Python scalars do
    assert replay.calls and replay.calls > 0


def test_a_list_argument_holding_a_tensor_the_step_made_is_built_by_each_run() -> None:
    x = torch.randn(3)

    def step() -> torch.Tensor:
        return torch.cat([x * 2.0, x])

    replay = RecordedStep(step)
    for _ in range(3):
        assert torch.equal(replay(), torch.cat([x * 2.0, x]))
        x.add_(1.0)
    assert replay.calls and replay.calls > 0


def test_a_call_the_program_cannot_express_replays_through_torchscript() -> None:
    x = torch.randn(2, 3)

    def step() -> torch.Tensor:  # a memory format, which the program's constants cannot hold
        return (x * 2.0).clone(memory_format=torch.contiguous_format)

    with torch.inference_mode():
        recording, _ = record(step)
        assert any("contiguous_format" in repr(call.kwargs) or "contiguous_format" in repr(call.args)
                   for call in recording.calls)
        with pytest.raises(NotRecordable, match="native program"):
            build_program(recording)
        replay = compile_replay(recording)
        x.add_(1.0)
        assert torch.equal(replay(), x * 2.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_planned_replay_writes_into_fixed_buffers_and_still_equals_the_eager_step(dtype: torch.dtype) -> None:
    step, refill, recording = _recorded_block(dtype, 1)
    with torch.inference_mode():
        replay = compile_replay(recording)  # plans what it can
        outputs = []
        for seed in (2, 3, 4):
            refill(seed)
            outputs.append(replay())
            assert torch.equal(outputs[-1], step())
    names = {call.op._schema.name for call in recording.calls}
    planned = planning.plan(recording)
    code = source(planned)
    # A planned output is one buffer that every replay rewrites, as a CUDA graph's is; otherwise each makes its own.
    same = isinstance(planned.output, External) and isinstance(recording.output, Slot)
    assert len({t.data_ptr() for t in outputs}) == (1 if same else len(outputs))
    # Which kernels a layer takes depends on the CPU's instructions; some ops keep the plain form for some dtypes.
    into = {name for name in names & planning.INTO.keys() if dtype in planning.INTO_DTYPES.get(name, (dtype,))}
    for name in into:
        assert f".{planning.INTO[name]}(" in code and f".{name.split('::')[1]}(" not in code
    if into - {"frame_cpu::add_rms_norm", "frame_cpu::silu_and_mul"}:  # a planned linear
        # The rotary's view of the linear's buffer is made once, when the step is planned, not by each replay (where
        # the linear writes a planned buffer: a CPU without AVX-512 BF16 runs another bfloat16 linear).
        assert planned is not recording and code.count("as_strided(") < source(recording).count("as_strided(")


def test_a_step_whose_buffers_would_be_too_large_replays_as_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(4, 8)

    def step() -> torch.Tensor:
        out = torch.empty(4, 8)
        out.copy_(x)
        return out[:, :4].sum(dim=[1]) + 1

    with torch.inference_mode():
        recording, first = record(step)
        assert planning.plan(recording) is not recording  # the empty and its view become buffers
        monkeypatch.setattr(planning, "MAX_PLANNED_BYTES", 0)
        assert planning.plan(recording) is recording
        assert torch.equal(compile_replay(recording)(), first)


def test_a_list_of_numbers_is_built_once_and_shared_by_every_call_that_passes_it() -> None:
    # TorchScript builds a list written at its call on every replay; the sizes and strides of views repeat from
    # layer to layer, so each distinct list is built once at the top of the step. An empty list keeps its call's.
    x = torch.arange(24.0).reshape(2, 12)

    def step() -> torch.Tensor:
        a, b = x[:, :6].reshape(2, 2, 3), x[:, 6:].reshape(2, 2, 3)  # views: the same sizes and strides
        return a.sum(dim=[2]) + b.sum(dim=[2]) + x.sum(dim=[0, 1])

    with torch.inference_mode():
        recording, first = record(step)
        code = source(recording)
        assert torch.equal(compile_replay(recording)(), first)
    built = [line.split("=", 1)[1] for line in code.splitlines() if ": List[int] = " in line]
    assert len(built) == len(set(built)) and "[2, 2, 3]" in " ".join(built)
    body = code.split("ext[")[0]  # the shared lists come before the externals are unpacked
    assert all(f"{name}: List[int]" in body for name in ("c0", "c1"))


def test_a_step_that_reads_a_value_back_runs_eagerly() -> None:
    x = torch.arange(4.0)

    def step() -> torch.Tensor:
        return x * float(x.sum())  # the sum reaches Python: a replay would keep the first one

    with pytest.raises(NotRecordable, match="_local_scalar_dense"):
        record(step)
    replay = RecordedStep(step)
    assert torch.equal(replay(), x * 6.0) and replay.calls == 0
    x.add_(1.0)
    assert torch.equal(replay(), x * 10.0)


def test_a_step_that_computes_outside_torchs_ops_runs_eagerly() -> None:
    x = torch.arange(4.0)

    def step() -> torch.Tensor:  # numpy reads x's memory without a dispatched op: a recording would freeze it
        return torch.from_numpy(x.numpy() * 2.0) + 1.0

    with pytest.raises(NotRecordable, match="outside torch's ops"):
        record(step)
    replay = RecordedStep(step)
    assert torch.equal(replay(), x * 2.0 + 1.0) and replay.calls == 0
    x.add_(1.0)
    assert torch.equal(replay(), x * 2.0 + 1.0)


def test_a_view_as_another_dtype_is_never_replayed_as_the_first_dtype() -> None:
    blocks = torch.tensor([0, 60, 0, 64], dtype=torch.uint8)  # two float16 numbers, 1.0 and 2.0, as bytes

    def step() -> torch.Tensor:  # a GGUF scale read from its block's bytes
        return blocks.view(torch.float16).float() * 3.0

    replay = RecordedStep(step)
    for expected in ([3.0, 6.0], [6.0, 12.0], [12.0, 24.0]):
        assert replay().tolist() == expected
        blocks[1::2] += 4  # the exponent bits: each number doubles
    # The native program calls the overload recorded, view.dtype, so the step replays.
    assert replay.calls and replay.calls > 0
    # TorchScript spells a dtype as an int, so view(dtype) would resolve to view(size): it refuses the step.
    with torch.inference_mode():
        recording, _ = record(step)
    with pytest.raises(NotRecordable):
        compile_script(recording)


def test_the_recording_is_made_on_the_first_replay_and_the_option_turns_it_off() -> None:
    x = torch.ones(3)
    platform = CpuPlatform()
    replay = platform.capture_graph(lambda: torch.nn.functional.silu(x * 2.0))
    assert isinstance(replay, RecordedStep) and replay.calls is None
    assert torch.equal(replay(), torch.nn.functional.silu(x * 2.0)) and replay.calls == 2
    x.fill_(-1.0)
    assert torch.equal(replay(), torch.nn.functional.silu(x * 2.0))
    assert CpuPlatform(CpuOptions(decode_graphs=False)).capture_graph(lambda: x) is None


def _failing_replay() -> torch.Tensor:
    raise RuntimeError("Expected Tensor but got Double")  # what a program's mistyped argument raised once


@pytest.mark.parametrize("replay", [lambda: torch.zeros(3), _failing_replay], ids=["differs", "fails"])
def test_a_replay_that_differs_from_its_recorded_run_or_fails_is_not_kept(monkeypatch: pytest.MonkeyPatch,
                                                                          replay) -> None:
    import frame_platform_cpu.graphs as graphs

    x = torch.ones(3)
    # A wrong replay, as a bug would make.
    monkeypatch.setattr(graphs, "compile_replay", lambda recording, teams=True: replay)
    step = RecordedStep(lambda: x * 2.0)
    for value in (1.0, 5.0):
        x.fill_(value)
        assert torch.equal(step(), x * 2.0)
    assert step.calls == 0  # the step runs eagerly from its first call on


class Chain(nn.Module):
    """norm -> three linears in a row -> rotary: a stretch of the platform's own calls, as a decoder layer's
    output projection, norm, SwiGLU, down projection and QKV are."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        cpu, dtype = torch.device("cpu"), torch.bfloat16
        self.norm = RMSNorm(hidden, 1e-5, cpu, dtype)
        self.first, self.second = Linear(hidden, 96, False, cpu, dtype), Linear(96, 160, True, cpu, dtype)
        self.third, self.rotate = Linear(160, hidden, False, cpu, dtype), RotateHalves()
        gen = torch.Generator().manual_seed(0)
        for p in self.parameters():
            p.data.copy_(torch.randn(p.shape, generator=gen) * 0.1)

    def forward(self, x: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h, residual = self.norm(x, residual)
        out = self.third(self.second(self.first(h)))
        self.rotate(out.view(x.shape[0], 2, 32), cos, sin)
        return out.float() + residual.float()


_NO_PACKED_BF16 = pytest.mark.skipif(
    _WHY_NOT is not None or probe.bf16_path() != "avx512_bf16" or kernels.amx_usable(),
    reason="the anchors are the AVX-512 BF16 packed linears' (an AMX CPU's bfloat16 linears are its tiles')")


@_NO_PACKED_BF16
@pytest.mark.parametrize("rows", [1, 5, 20])
def test_a_stretch_of_the_platforms_calls_runs_as_one_team_with_the_same_bits(rows: int) -> None:
    chain = Chain()
    attach_platform_kernels(chain, CpuPlatform())
    x, residual = torch.empty(rows, 64, dtype=torch.bfloat16), torch.empty(rows, 64, dtype=torch.bfloat16)
    cos, sin = torch.empty(rows, 1, 16, dtype=torch.bfloat16), torch.empty(rows, 1, 16, dtype=torch.bfloat16)

    def refill(seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        for buffer in (x, residual, cos, sin):
            buffer.copy_(torch.randn(buffer.shape, generator=gen))

    with torch.inference_mode():
        refill(1)
        recording, _ = record(lambda: chain(x, residual, cos, sin))
        program = build_program(planning.plan(recording))
        assert program.num_teams() == 1
        assert program.num_bound() == 4  # the norm and the linears; the rotary reads a view the run makes
        for seed in (2, 3):
            refill(seed)
            expected = chain(x, residual, cos, sin)
            program.set_teams(True)
            bound = program.run().clone()
            program.set_bound(False)
            teamed = program.run().clone()
            program.set_bound(True)
            program.set_teams(False)
            assert torch.equal(bound, expected) and torch.equal(teamed, expected)
            assert torch.equal(program.run(), expected)


@_NO_PACKED_BF16
@pytest.mark.parametrize("teams", [True, False])
def test_a_call_that_fails_inside_a_team_raises_after_it(teams: bool) -> None:
    kernels.load()
    weight = kernels.pack_weight(torch.randn(64, 32).bfloat16())
    x, y = torch.randn(2, 32).bfloat16(), torch.empty(2, 64, dtype=torch.bfloat16)
    wrong = torch.empty(2, 48, dtype=torch.bfloat16)  # not the product's shape: the second call refuses it
    program = torch.classes.frame_cpu.StepProgram(0)
    for out in (y, wrong, y):
        program.call("frame_cpu::packed_linear_into", "", [x, weight, None, 64, out], [-1] * 5, [])
    program.set_output(y, -1)
    program.set_teams(teams)
    assert program.num_teams() == (1 if teams else 0)
    assert program.num_bound() == (2 if teams else 0)  # the wrong call's checks refuse to bind it
    with pytest.raises(RuntimeError, match="out must be a contiguous"):
        program.run()
    program = torch.classes.frame_cpu.StepProgram(0)  # and a good program runs after it
    for _ in range(2):
        program.call("frame_cpu::packed_linear_into", "", [x, weight, None, 64, y], [-1] * 5, [])
    program.set_output(y, -1)
    assert torch.equal(program.run(), torch.ops.frame_cpu.packed_linear(x, weight, None, 64))


def test_the_step_teams_option_turns_the_teams_off() -> None:
    _, _, recording = _recorded_block(torch.float32, 2)
    assert build_program(planning.plan(recording), teams=False).num_teams() == 0
    assert CpuPlatform(CpuOptions(step_teams=False)).capture_graph(lambda: torch.zeros(1)).teams is False
    assert CpuPlatform().capture_graph(lambda: torch.zeros(1)).teams is True


@pytest.mark.skipif(not probe.has_avx2_fma(), reason="the packed float32 kernel needs AVX2 and FMA")
def test_only_float32_rows_of_the_float32_linear_are_planned_into_the_teams() -> None:
    # bfloat16 x (bfloat16-storage weights) is widened before the product, which a team's first thread would run
    # alone: that call stays the plain op, outside the teams.
    for dtype, planned in ((torch.float32, "frame_cpu::packed_linear_f32_into"),
                           (torch.bfloat16, "frame_cpu::packed_linear_f32")):
        linear = kernels.float32_linear(torch.randn(32, 16).to(dtype), None)
        x = torch.randn(2, 16).to(dtype)
        with torch.inference_mode():
            recording, _ = record(lambda linear=linear, x=x: linear(x) * 2)
        names = [call.op._schema.name for call in planning.plan(recording).calls]
        assert planned in names, (dtype, names)
