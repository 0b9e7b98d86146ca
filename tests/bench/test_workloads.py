"""Workloads are deterministic for a seed, have the promised sharing structure, and come through the registry and
the hook like any plugin kind's; the built-ins pass the workload conformance suite."""

from __future__ import annotations

import itertools
import subprocess
import sys
import types
from pathlib import Path
from xml.etree import ElementTree

import pytest
from frame.cli.plugins_cmd import collect
from frame.errors import ConfigError, IncompatiblePluginError
from frame.hookspecs import hookimpl
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.registration import plugin_module, register_source_tree, registered
from frame.testing.workload import WorkloadConformance
from frame.workloads import Workload, WorkloadRequest, builtin, greedy, load_workloads

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
    # Greedy, exactly max_tokens: every system does the same work (copy_edit stops at its end of text instead).
    assert all(r.params.temperature == 0 and (r.params.ignore_eos or name == "copy_edit") for r in first)
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


def _plugin(name: str, hook: str = "frame_workload_list") -> types.ModuleType:
    def build(ctx, params):  # type: ignore[no-untyped-def]
        return [WorkloadRequest(tuple(ctx.tokens(params["n"])), greedy(1))]

    def offer() -> list[Workload]:
        return [Workload(name, "test workload", {"n": 4}, build, {"n": "prompt tokens"})]

    offer.__name__ = hook
    return plugin_module(f"test_workload_plugin_{name}", **{hook: hookimpl(offer)})


def test_built_ins_and_a_plugin_answer_the_same_hook(tokenizer) -> None:
    registry = PluginRegistry(allow=frozenset())
    with registered(registry, "workload", "test", _plugin("from_a_plugin")):
        catalog = load_workloads(registry)
        assert registry.is_loaded("workload", "builtin")
        assert set(catalog.workloads) == {*BUILT_INS, "from_a_plugin"}
        assert catalog.providers["from_a_plugin"] == "workload:test"
        assert catalog.providers["shared_prefix"] == "workload:builtin"
        assert len(catalog.get("from_a_plugin").generate(tokenizer, 0, n=7)[0].prompt_token_ids) == 7


def test_an_old_style_plugin_with_the_deprecated_hook_still_works(tokenizer) -> None:
    """``frame_workloads`` (the hook's name before workloads became a kind) still counts, with a FutureWarning."""
    registry = PluginRegistry(allow=frozenset())
    with pytest.warns(FutureWarning, match="frame_workloads is deprecated: rename the hook to frame_workload_list"):
        registry.register("workload", "old", _plugin("old_style", hook="frame_workloads"))
    try:
        catalog = load_workloads(registry)
        assert catalog.providers["old_style"] == "workload:old" and not catalog.failures
        assert len(catalog.get("old_style").generate(tokenizer, 0)[0].prompt_token_ids) == 4
        assert [w.name for w in PluginHooks(registry).workload_list("old")] == ["old_style"]
    finally:
        registry.unregister("workload", "old")


def test_a_plugin_without_either_hook_is_refused() -> None:
    with pytest.raises(IncompatiblePluginError, match="does not implement frame_workload_list, which every workload"):
        PluginRegistry(allow=frozenset()).register("workload", "empty", plugin_module("empty_workloads"))


def test_two_plugins_offering_one_name_is_a_usage_error_naming_both() -> None:
    registry = PluginRegistry(allow=frozenset())
    with registered(registry, "workload", "clash", _plugin("shared_prefix")), pytest.raises(
            ConfigError, match=r"Two plugins offer a workload named 'shared_prefix' \(workload:builtin and "
                               r"workload:clash\); uninstall one of them\."):
        load_workloads(registry)


def test_a_workload_plugin_that_fails_to_load_is_reported_not_fatal(tmp_path: Path) -> None:
    """A source tree whose entry point fails to import: the built-ins still come, the failure names the plugin."""
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "frame-workload-broken"\nversion = "0.1"\n'
        '[project.entry-points."frame.workloads"]\nbroken = "frame_workload_broken_mod"\n')
    (tmp_path / "frame_workload_broken_mod.py").write_text("raise ImportError('no such dependency: ragdata')\n")
    undo = register_source_tree(tmp_path)
    try:
        catalog = load_workloads(PluginRegistry(allow=None, disable=frozenset()))
    finally:
        undo()
    assert set(BUILT_INS) <= set(catalog.workloads)
    assert catalog.failures["broken"] == (
        f"The workload plugin 'broken' from the source tree of frame-workload-broken 0.1 at {tmp_path} failed to "
        "import (ImportError: no such dependency: ragdata); fix it or choose another of: builtin (frame bench "
        "--workload picks one of their workloads by name).")


def test_a_hook_that_raises_or_answers_garbage_is_left_out(caplog) -> None:
    def boom() -> list[Workload]:
        raise RuntimeError("dataset missing")

    def garbage() -> list[Workload]:
        return "not a list"  # type: ignore[return-value]

    registry = PluginRegistry(allow=frozenset())
    with registered(registry, "workload", "boom", plugin_module("boom", frame_workload_list=hookimpl(boom))), \
            registered(registry, "workload", "junk", plugin_module("junk", frame_workload_list=hookimpl(garbage))):
        catalog = load_workloads(registry)
    assert set(catalog.workloads) == set(BUILT_INS)
    assert "raised in frame_workload_list (RuntimeError: dataset missing)" in caplog.text
    assert catalog.failures == {"workload:junk": "The plugin 'workload:junk' answered its workload hook with str, not "
                                "a list of frame.interfaces.workload.Workload; its workloads are left out."}


def test_frame_plugins_lists_the_workload_plugins_and_what_they_offer() -> None:
    registry = PluginRegistry(allow=frozenset({"workload:builtin", "workload:test"}))
    with registered(registry, "workload", "test", _plugin("from_a_plugin")):
        rows = {r.name: r for r in collect(registry) if r.kind == "workload"}
    assert rows["builtin"].runs_here and rows["builtin"].why == ", ".join(BUILT_INS)
    assert (rows["test"].runs_here, rows["test"].why, rows["test"].wheel) == (True, "from_a_plugin", "(in-process)")


BAD_PLUGIN = """
import random

import pytest
from frame.hookspecs import hookimpl
from frame.interfaces.workload import Workload, WorkloadRequest, greedy
from frame.testing.workload import WorkloadConformance

FRAME_API_VERSION = 2


def build(ctx, p):  # the module's random, not ctx.rng; a prompt longer than the context
    return [WorkloadRequest(tuple(random.choices(ctx.vocab, k=p["prompt_len"])), greedy(p["max_tokens"]))]


@hookimpl
def frame_workload_list():
    return [Workload("sloppy", "draws from the wrong RNG", {"prompt_len": 3000, "max_tokens": 4}, build,
                     {"max_tokens": "new tokens"})]


class TestSloppy(WorkloadConformance):
    plugin_module = __import__(__name__)
    plugin_name = "sloppy"
"""


def test_the_suite_fails_a_sloppy_workload_where_it_is_sloppy(tmp_path: Path) -> None:
    """The suite is not a formality: a workload drawing from the global RNG, with an undocumented parameter and a
    prompt past the context, fails exactly those checks (and passes the others)."""
    (tmp_path / "test_sloppy.py").write_text(BAD_PLUGIN)
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                    f"--junitxml={report}", "test_sloppy.py"], cwd=tmp_path, capture_output=True, timeout=300)
    failed = sorted(c.get("name") for c in ElementTree.parse(report).iter("testcase") if c.find("failure") is not None)
    assert failed == ["test_every_default_is_documented", "test_requests_fit_the_context_and_use_the_tokenizers_ids",
                      "test_the_same_seed_gives_the_same_requests"]


def test_the_workloads_table_in_the_docs_is_the_built_ins_with_their_defaults(catalog) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md").read_text()
    table = text[text.index("| workload | shape | parameters (defaults) |"):].split("\n\n")[0].splitlines()[2:]
    rows = {row.split(" | ")[0].strip("| `"): row.split(" | ")[-1] for row in table}
    assert sorted(rows) == sorted(BUILT_INS)
    for name, cell in rows.items():
        for key, default in catalog.get(name).defaults.items():
            assert f"`{key}` {default}" in cell, f"docs/benchmarks.md: {name}'s {key} is {default}"


class TestBuiltInWorkloads(WorkloadConformance):
    """The core's own workloads pass the suite every workload plugin runs."""

    plugin_module = builtin
    plugin_name = "builtin"
