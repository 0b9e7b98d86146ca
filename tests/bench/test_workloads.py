"""Workloads are deterministic for a seed, have the promised sharing structure, and come through the hook."""

from __future__ import annotations

import itertools
import types

import pytest
from frame.errors import ConfigError
from frame.hookspecs import hookimpl
from frame.plugins.registry import PluginRegistry
from frame.version import API_VERSION
from frame.workloads import Workload, WorkloadRequest, greedy, load_workloads

BUILT_INS = ["shared_prefix", "multi_turn", "few_shot", "branching", "no_sharing", "mixed_batch", "single_stream",
             "copy_edit"]


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@pytest.fixture(scope="module")
def catalog():  # type: ignore[no-untyped-def]
    return load_workloads(PluginRegistry(allow=frozenset()))


@pytest.mark.parametrize("name", BUILT_INS)
def test_same_seed_same_requests_other_seed_other_requests(catalog, tokenizer, name: str) -> None:
    workload = catalog.get(name)
    first, again, other = (workload.generate(tokenizer, seed) for seed in (3, 3, 4))
    assert [r.prompt_token_ids for r in first] == [r.prompt_token_ids for r in again]
    assert [r.prompt_token_ids for r in first] != [r.prompt_token_ids for r in other]
    special = set(tokenizer.all_special_ids)
    assert all(r.params.temperature == 0 and r.params.ignore_eos for r in first)
    if name not in ("mixed_batch", "single_stream", "copy_edit"):  # the chat template's own tokens may be special
        assert not any(special & set(r.prompt_token_ids) for r in first)


def test_shared_prefix_shares_exactly_the_system_prompt(catalog, tokenizer) -> None:
    reqs = catalog.get("shared_prefix").generate(tokenizer, 0, num_requests=6, prefix_len=50)
    assert len(reqs) == 6
    for a, b in itertools.combinations(reqs, 2):
        assert _common_prefix(a.prompt_token_ids, b.prompt_token_ids) >= 50
        assert a.prompt_token_ids != b.prompt_token_ids


def test_shared_prefix_tenants_get_their_own_salt(catalog, tokenizer) -> None:
    reqs = catalog.get("shared_prefix").generate(tokenizer, 0, num_requests=4, tenants=2)
    assert [r.cache_salt for r in reqs] == ["tenant-0", "tenant-1", "tenant-0", "tenant-1"]


def test_multi_turn_resends_the_conversation_and_prefixes_end_off_block_boundaries(catalog, tokenizer) -> None:
    reqs = catalog.get("multi_turn").generate(tokenizer, 0, num_conversations=5, num_turns=4)
    assert len(reqs) == 20
    ends = []
    for conv in range(5):
        turns = reqs[conv * 4:(conv + 1) * 4]
        assert [t.wave for t in turns] == [0, 1, 2, 3]
        for before, after in itertools.pairwise(turns):
            assert after.prompt_token_ids[:len(before.prompt_token_ids)] == before.prompt_token_ids
            assert len(after.prompt_token_ids) > len(before.prompt_token_ids)
            ends.append(len(before.prompt_token_ids))
    # the prefix a turn can reuse ends where the previous turn's prompt ended: mostly inside a block
    assert sum(1 for e in ends if e % 16) >= len(ends) - 2


def test_few_shot_variants_share_examples_and_all_share_the_instruction(catalog, tokenizer) -> None:
    reqs = catalog.get("few_shot").generate(tokenizer, 0, num_requests=8, num_variants=2, instruction_len=30,
                                           example_len=[40, 40], shots=3, num_examples=3)
    same_variant = _common_prefix(reqs[0].prompt_token_ids, reqs[2].prompt_token_ids)
    assert same_variant >= 30 + 3 * 40
    assert all(_common_prefix(reqs[0].prompt_token_ids, r.prompt_token_ids) >= 30 for r in reqs)


def test_branching_is_a_tree_over_one_context(catalog, tokenizer) -> None:
    reqs = catalog.get("branching").generate(tokenizer, 0, context_len=100, fanout=3, depth=2, branch_len=[5, 5])
    assert len(reqs) == 9
    assert all(len(r.prompt_token_ids) == 110 for r in reqs)
    assert _common_prefix(reqs[0].prompt_token_ids, reqs[1].prompt_token_ids) >= 105  # siblings
    assert 100 <= _common_prefix(reqs[0].prompt_token_ids, reqs[3].prompt_token_ids) < 105  # cousins


def test_no_sharing_prompts_share_nothing(catalog, tokenizer) -> None:
    reqs = catalog.get("no_sharing").generate(tokenizer, 0, num_requests=10)
    assert max(_common_prefix(a.prompt_token_ids, b.prompt_token_ids)
               for a, b in itertools.combinations(reqs, 2)) <= 1


def test_mixed_batch_is_issue_6s_batch(catalog, tokenizer) -> None:
    reqs = catalog.get("mixed_batch").generate(tokenizer, 0)
    assert len(reqs) == 64
    assert all(50 <= len(r.prompt_token_ids) <= 400 for r in reqs)
    assert {r.params.max_tokens for r in reqs} == {128}
    single = catalog.get("single_stream").generate(tokenizer, 0)
    assert len(single) == 1 and single[0].params.max_tokens == 256


def test_unknown_parameter_is_a_usage_error_naming_the_valid_ones(catalog, tokenizer) -> None:
    with pytest.raises(ConfigError, match="has no parameter 'num_request'; its parameters are: num_requests"):
        catalog.get("no_sharing").generate(tokenizer, 0, num_request=3)
    with pytest.raises(ConfigError, match="No workload named 'nope'; choose one of: branching"):
        catalog.get("nope")


def _plugin(name: str) -> types.ModuleType:
    module = types.ModuleType(f"test_workload_plugin_{name}")
    module.FRAME_API_VERSION = API_VERSION

    def build(ctx, params):  # type: ignore[no-untyped-def]
        return [WorkloadRequest(tuple(ctx.tokens(params["n"])), greedy(1))]

    @hookimpl
    def frame_workloads() -> list[Workload]:
        return [Workload(name, "test workload", {"n": 4}, build)]

    module.frame_workloads = frame_workloads
    return module


def test_built_ins_and_a_plugin_answer_the_same_hook(tokenizer) -> None:
    registry = PluginRegistry(allow=frozenset())
    registry.pm.register(_plugin("from_a_plugin"), name="workload:test")
    catalog = load_workloads(registry)
    assert registry.pm.has_plugin("workload:builtin")
    assert set(catalog.workloads) == {*BUILT_INS, "from_a_plugin"}
    assert len(catalog.get("from_a_plugin").generate(tokenizer, 0, n=7)[0].prompt_token_ids) == 7


def test_two_plugins_offering_one_name_is_a_usage_error() -> None:
    registry = PluginRegistry(allow=frozenset())
    registry.pm.register(_plugin("shared_prefix"), name="workload:clash")
    with pytest.raises(ConfigError, match="Two plugins offer a workload named 'shared_prefix'"):
        load_workloads(registry)
