"""An op of one plugin's library run by another's threads: the cpu_paged attention's team form inside the cpu
platform's step program (``frame/team_form.h``).

The step program (``frame_platform_cpu``) finds ``frame_cpu_paged::forward``'s form through torch's dispatcher and
runs it on every thread of the parallel region its stretch already holds; the attention then shares its pieces and
items over that team instead of opening a region of its own. Each case here is a one-stretch program (two greedy
argmaxes, which every CPU's build splits over a team, around one attention call) whose attention must come out
bit for bit as the op called on its own gives it, with the same new K/V stored: a lone long decode (split over
the threads by KV head), decodes sharing prefix blocks (the cascade, a sync between its pieces and the items),
a mixed batch, float32, and an int8 pool (decoding in place, and a prefill widened on the first thread alone).
"""

from __future__ import annotations

import pytest
import torch
from frame.interfaces.attention import AttentionMetadata
from frame.testing.attention_reference import make_batch, quantized_kv
from frame_attention_cpu_paged import kernel as paged
from frame_platform_cpu import kernels

pytestmark = pytest.mark.skipif(kernels.unavailable_reason() is not None or paged.unavailable_reason() is not None,
                                reason="the cpu platform's or the cpu_paged kernels cannot be built here")

HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 16  # SmolLM2-135M's attention


def _case(name: str) -> tuple[list[torch.Tensor], AttentionMetadata]:
    """forward's tensor arguments (out, query, key, value, k_cache, v_cache) and the step's metadata."""
    contexts, new, dtype, kv = {
        "lone long decode": ([300], [1], torch.bfloat16, None),
        "decodes sharing a prefix": ([200, 230, 250, 260, 270], [1] * 5, torch.bfloat16, None),
        "mixed batch": ([0, 40, 170], [20, 1, 1], torch.bfloat16, None),
        "float32 decodes": ([150, 33], [1, 1], torch.float32, None),
        "int8 pool decode": ([300], [1], torch.bfloat16, torch.int8),
        "int8 pool prefill": ([0], [96], torch.bfloat16, torch.int8),
    }[name]
    q, k, v, k_cache, v_cache, meta = make_batch(contexts, new, BLOCK, HEADS, KV_HEADS, DIM, seed=3, dtype=dtype)
    if name == "decodes sharing a prefix":
        meta.block_tables[1:, :12] = meta.block_tables[0, :12].clone()
    if kv is not None:
        *_, k_cache, v_cache = quantized_kv(k, v, k_cache, v_cache, kv)
    return [torch.empty_like(q), q, k, v, k_cache, v_cache], meta


def _forward_arguments(tensors: list[torch.Tensor], meta: AttentionMetadata) -> list:
    return [*tensors, meta.slot_mapping, meta.block_tables, meta.query_start_loc, meta.seq_lens, 0.125, 0, 0.0, None]


def _program(arguments: list) -> object:
    """A one-stretch step program: an argmax, the attention, another argmax (the argmaxes are its anchors)."""
    logits, first, second = torch.randn(4, 300), torch.empty(4, dtype=torch.long), torch.empty(4, dtype=torch.long)
    program = torch.classes.frame_cpu.StepProgram(0)
    program.call("frame_cpu::row_argmax_into", "", [logits, first], [-1, -1], [])
    program.call("frame_cpu_paged::forward", "", arguments, [-1] * len(arguments), [])
    program.call("frame_cpu::row_argmax_into", "", [logits, second], [-1, -1], [])
    program.set_output(arguments[0], -1)
    return program


@pytest.fixture(scope="module", autouse=True)
def _libraries() -> None:
    kernels.load()
    paged.load()


@pytest.mark.parametrize("name", ["lone long decode", "decodes sharing a prefix", "mixed batch", "float32 decodes",
                                  "int8 pool decode", "int8 pool prefill"])
def test_the_attentions_team_form_gives_the_ops_bits_inside_a_team(name: str) -> None:
    tensors, meta = _case(name)
    alone = [t.clone() for t in tensors]
    torch.ops.frame_cpu_paged.forward(*_forward_arguments(alone, meta))
    program = _program(_forward_arguments(tensors, meta))
    assert program.num_teams() == 1 and program.num_team_forms() == 1
    assert "frame_cpu_paged::forward team form shared barrier" in program.describe()
    for forms in (True, False, True):  # off: the program leaves the region and calls the op through the dispatcher
        program.set_team_forms(forms)
        tensors[0].zero_()
        program.run()
        assert torch.equal(tensors[0], alone[0]), f"{name}: attention, forms {forms}"
        assert torch.equal(tensors[4], alone[4]) and torch.equal(tensors[5], alone[5]), f"{name}: stored K/V"


def test_a_team_form_that_refuses_its_arguments_raises_after_the_team_and_the_program_runs_again() -> None:
    tensors, meta = _case("lone long decode")
    arguments = _forward_arguments(tensors, meta)
    arguments[6] = meta.slot_mapping + tensors[4].shape[0] * BLOCK  # past the pool's last slot
    with pytest.raises(RuntimeError, match="outside the cache"):
        _program(arguments).run()
    good = _program(_forward_arguments(tensors, meta))
    alone = [t.clone() for t in tensors]
    torch.ops.frame_cpu_paged.forward(*_forward_arguments(alone, meta))
    good.run()
    assert torch.equal(tensors[0], alone[0])


def test_an_op_without_a_team_form_leaves_the_region() -> None:
    # aten's ops have no `_team_form`: the program calls them between its stretches, as before.
    x = torch.randn(4, 300)
    program = torch.classes.frame_cpu.StepProgram(0)
    program.call("aten::mul_", "Scalar", [x, 2.0], [-1, -1], [])
    assert program.num_team_forms() == 0
