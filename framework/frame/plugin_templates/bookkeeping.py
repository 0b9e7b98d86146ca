"""Templates of the kinds that are bookkeeping or host-side logic: scheduler, cache strategy, proposer."""

from __future__ import annotations

from frame.plugin_templates.kind import KindTemplate

SCHEDULER = KindTemplate(
    module="scheduler",
    plugin='''"""The {name} scheduler plugin: its hooks."""

from __future__ import annotations

from frame import hookimpl
from frame.interfaces.scheduler import SchedulerLimits, SchedulingPolicy
from pydantic import BaseModel

from {package}.scheduler import {class_name}

FRAME_API_VERSION = {api_version}


@hookimpl
def frame_scheduler_create(limits: SchedulerLimits, options: BaseModel | None) -> SchedulingPolicy:
    """The {class_name} policy; the engine runs continuous batching around it."""
    return {class_name}(limits)
''',
    implementation='''"""{class_name}: the {name} scheduling policy (the engine runs continuous batching around it)."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq

from frame.interfaces.scheduler import PrefixLookup, SchedulingPolicy
from frame.sequence import Sequence


class {class_name}(SchedulingPolicy):
    """Admits waiting requests in arrival order and preempts the newest; change the policy here."""

    def admission_order(self, waiting: Seq[Sequence], prefix: PrefixLookup) -> Iterable[Sequence]:
        return sorted(waiting, key=lambda seq: seq.arrival_time)

    def preemption_victim(self, running: Seq[Sequence]) -> Sequence:
        return max(running, key=lambda seq: seq.arrival_time)
''',
    tests='''"""frame's scheduler conformance suite, run against this plugin through its hooks."""

import pytest
from frame.testing.scheduler import SchedulerConformance, scheduler_plugin_factory


class Test{class_name}(SchedulerConformance):
    @pytest.fixture
    def scheduler_factory(self):
        return scheduler_plugin_factory("{name}")
''',
    test_requires=(),
    select="`frame generate --sched {name} --prompt \"Hello\"`, `sched: {name}` in a config file, or "
           "`LLM(sched=\"{name}\")`.",
    runs="Anywhere: a scheduler is bookkeeping over token and block ids (keep it free of torch and numpy).",
)

CACHE = KindTemplate(
    module="strategy",
    plugin='''"""The {name} KV-cache strategy plugin: its hooks."""

from __future__ import annotations

from frame import hookimpl
from frame.interfaces.cache import KVCacheStrategy
from pydantic import BaseModel

from {package}.strategy import {class_name}

FRAME_API_VERSION = {api_version}


@hookimpl
def frame_cache_create(num_blocks: int, block_size: int, options: BaseModel | None) -> KVCacheStrategy:
    """A {class_name} over a pool of ``num_blocks`` blocks of ``block_size`` slots."""
    return {class_name}(num_blocks, block_size)
''',
    implementation='''"""{class_name}: the {name} KV-cache strategy."""

from __future__ import annotations

from collections import deque
from typing import Any

from frame.interfaces.cache import CacheSequence, KVCacheStrategy, PrefixMatch


class {class_name}(KVCacheStrategy):
    """A paged allocator that reuses nothing yet: the core base owns block tables, growth and stats. To cache
    prefixes, find them in lookup(), claim them in plan_claim()/claim(), keep them in publish()/release() and
    evict them in take(), as frame.interfaces.cache.KVCacheStrategy describes (then drop reuses_prefixes)."""

    reuses_prefixes = False
    eviction_policy = "none"

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._free: deque[int] = deque(range(num_blocks))

    def lookup(self, seq: CacheSequence) -> PrefixMatch:
        return PrefixMatch(0)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def take(self, count: int) -> list[int]:
        return [self._free.popleft() for _ in range(count)]

    def publish(self, seq: CacheSequence, table: list[int], state: Any, num_tokens: int) -> Any:
        return state

    def release(self, seq: CacheSequence, table: list[int], state: Any, num_computed: int) -> None:
        self._free.extend(table)

    def clear(self) -> None:
        """Nothing is cached, so there is nothing to drop."""
''',
    tests='''"""frame's KV-cache conformance suite, run against this strategy and through its plugin hooks."""

import pytest
from frame.testing.cache import CacheConformance

from {package} import plugin
from {package}.strategy import {class_name}


class Test{class_name}(CacheConformance):
    plugin_module = plugin
    plugin_name = "{name}"

    @pytest.fixture
    def make_cache(self):
        return {class_name}
''',
    test_requires=(),
    select="`frame generate --cache {name} --prompt \"Hello\"`, `cache: {name}` in a config file, or "
           "`LLM(cache=\"{name}\")`.",
    runs="Anywhere: a KV-cache strategy is bookkeeping over token and block ids (keep it free of torch and numpy).",
)

PROPOSER = KindTemplate(
    module="proposer",
    plugin='''"""The {name} speculative-decoding proposer plugin: its hooks."""

from __future__ import annotations

from frame import hookimpl
from frame.interfaces.proposer import Proposer, ProposerContext
from pydantic import BaseModel

from {package}.proposer import {class_name}

FRAME_API_VERSION = {api_version}


@hookimpl
def frame_proposer_create(num_speculative_tokens: int, context: ProposerContext,
                          options: BaseModel | None) -> Proposer:
    """A {class_name} drafting up to ``num_speculative_tokens`` tokens per request and step."""
    return {class_name}(num_speculative_tokens)
''',
    implementation='''"""{class_name}: the {name} proposer."""

from __future__ import annotations

from collections.abc import Sequence

from frame.interfaces.proposer import Proposal, ProposalRequest, Proposer


class {class_name}(Proposer):
    """Proposes that the request's last token repeats; replace with a real guess (verification keeps the output
    exact whatever is proposed, so only speed depends on it)."""

    def propose(self, requests: Sequence[ProposalRequest]) -> list[Proposal]:
        return [Proposal([int(r.token_ids[-1])] * r.max_tokens) for r in requests]
''',
    tests='''"""frame's proposer conformance suite, run against this proposer and through its plugin hooks."""

import pytest
from frame.testing.proposer import ProposerConformance

from {package} import plugin
from {package}.proposer import {class_name}


class Test{class_name}(ProposerConformance):
    plugin_module = plugin
    plugin_name = "{name}"

    @pytest.fixture
    def make_proposer(self):
        return {class_name}
''',
    test_requires=(),
    select="`frame generate --speculative-proposer {name} --prompt \"Hello\"`, `speculative_proposer: {name}` in "
           "a config file, or `LLM(speculative_proposer=\"{name}\")`.",
    runs="In every model worker, after each step samples (`frame plugins` shows it).",
)
