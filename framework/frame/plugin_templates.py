"""Source templates for ``frame new-plugin``, one per kind (``str.format`` fields in braces, ``{{`` escapes)."""

from __future__ import annotations

_HEADER = '''"""The {name} {kind} plugin: its hooks."""

from __future__ import annotations

from frame import hookimpl

FRAME_API_VERSION = 2
'''

SCHEDULER = _HEADER + '''
from frame.interfaces.scheduler import SchedulingPolicy


class {class_name}(SchedulingPolicy):
    """Admits waiting requests in arrival order and preempts the newest; change the policy here (the engine
    owns budgets, chunking, stop rules and freeing)."""

    def admission_order(self, waiting, prefix):
        return sorted(waiting, key=lambda seq: seq.arrival_time)

    def preemption_victim(self, running):
        return max(running, key=lambda seq: seq.arrival_time)


@hookimpl
def frame_scheduler_create(limits, options):
    return {class_name}(limits)
'''

SCHEDULER_TESTS = '''import pytest

from frame.testing.scheduler import SchedulerConformance, scheduler_plugin_factory


class Test{class_name}(SchedulerConformance):
    @pytest.fixture
    def scheduler_factory(self):
        return scheduler_plugin_factory("{name}")
'''

CACHE = _HEADER + '''
from collections import deque

from frame.interfaces.cache import KVCacheStrategy, PrefixMatch


class {class_name}(KVCacheStrategy):
    """A paged allocator that reuses nothing yet: the core base owns block tables, growth and stats. To cache
    prefixes, find them in lookup(), claim them in plan_claim()/claim(), keep them in publish()/release() and
    evict them in take(), as frame.interfaces.cache.KVCacheStrategy describes."""

    reuses_prefixes = False
    eviction_policy = "none"

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self._free = deque(range(num_blocks))

    def lookup(self, seq):
        return PrefixMatch(0)

    @property
    def num_free_blocks(self):
        return len(self._free)

    def take(self, count):
        return [self._free.popleft() for _ in range(count)]

    def publish(self, seq, table, state, num_tokens):
        return state

    def release(self, seq, table, state, num_computed):
        self._free.extend(table)

    def clear(self):
        pass


@hookimpl
def frame_cache_create(num_blocks, block_size, options):
    return {class_name}(num_blocks, block_size)
'''

CACHE_TESTS = '''import pytest

from frame.testing.cache import CacheConformance
from {package}.plugin import {class_name}


class Test{class_name}(CacheConformance):
    @pytest.fixture
    def make_cache(self):
        return {class_name}
'''

ATTENTION = _HEADER + '''
from frame.interfaces.attention import AttentionBackend


class {class_name}(AttentionBackend):
    """Fill in write_kv and attend as frame.interfaces.attention.AttentionBackend describes."""

    def write_kv(self, key, value, k_cache, v_cache, slot_mapping):
        raise NotImplementedError

    def attend(self, query, k_cache, v_cache, meta):
        raise NotImplementedError


@hookimpl
def frame_attention_platforms():
    return ["cpu", "cuda", "rocm"]


@hookimpl
def frame_attention_create(num_heads, num_kv_heads, head_dim, scale, dtype, platform, options):
    return {class_name}(num_heads, num_kv_heads, head_dim, scale, dtype)
'''

ATTENTION_TESTS = '''from frame.testing.attention import AttentionBackendSuite


class Test{class_name}(AttentionBackendSuite):
    plugin_name = "{name}"
'''

PLATFORM = _HEADER + '''
from frame.interfaces.platform import Platform


class {class_name}(Platform):
    """Fill in each member as frame.interfaces.platform.Platform describes."""

    @classmethod
    def unavailable_reason(cls):
        return "this platform is not implemented yet"

    @property
    def device(self):
        raise NotImplementedError

    @property
    def supported_dtypes(self):
        raise NotImplementedError

    def describe(self):
        raise NotImplementedError

    def kv_cache_budget_bytes(self, memory_fraction, model_bytes):
        raise NotImplementedError

    def preferred_attention(self, installed):
        raise NotImplementedError


@hookimpl
def frame_platform_check():
    return {class_name}.unavailable_reason()


@hookimpl
def frame_platform_create(options):
    return {class_name}()
'''

PLATFORM_TESTS = '''from frame.testing.platform import PlatformSuite


class Test{class_name}(PlatformSuite):
    plugin_name = "{name}"
'''

MODEL = _HEADER + '''

@hookimpl
def frame_model_architectures():
    return []  # the Hugging Face architecture names this family builds, e.g. "MyModelForCausalLM"


@hookimpl
def frame_model_create(hf_config, dtype, device, attention):
    raise NotImplementedError("build a frame.interfaces.model.CausalLM for hf_config")
'''

MODEL_TESTS = '''from frame.testing.model import ModelFamilySuite


class Test{class_name}(ModelFamilySuite):
    plugin_name = "{name}"
'''

TEMPLATES: dict[str, dict[str, str]] = {
    "scheduler": {"plugin": SCHEDULER, "tests": SCHEDULER_TESTS},
    "cache": {"plugin": CACHE, "tests": CACHE_TESTS},
    "attention": {"plugin": ATTENTION, "tests": ATTENTION_TESTS},
    "platform": {"plugin": PLATFORM, "tests": PLATFORM_TESTS},
    "model": {"plugin": MODEL, "tests": MODEL_TESTS},
}
