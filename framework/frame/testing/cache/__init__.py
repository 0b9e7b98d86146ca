"""Conformance suite for KV-cache strategy plugins: subclass :class:`CacheConformance` in your plugin's tests.

The suite drives a strategy the way the scheduler and the model runner do (:class:`CacheDriver`) and checks it
after every call: block tables have the right length, no block is in two live tables unless it is a shared,
fully computed prefix block, the free count and the usage gauge agree, counters only grow, ``allocate`` that
fails changes nothing, and, through a shadow of the KV pool, that every slot a live sequence reads holds that
sequence's own token (so a wrong reuse, a bad copy or a write into a shared block cannot go unnoticed)::

    class TestMyCache(CacheConformance):
        plugin_module = my_plugin          # optional: also check registration and the create hook
        plugin_name = "mine"

        @pytest.fixture
        def make_cache(self):
            return lambda num_blocks, block_size: MyCache(num_blocks, block_size)

What a strategy must reuse is read from its own ``reuses_prefixes`` class attribute (False: it never matches);
its eviction order is its own. ``check_internals`` may be overridden to check private state (reference counts
against the live tables) after every call.
"""

from frame.testing.cache.driver import CacheDriver, CacheFactory, check_reset, prompt, random_workload
from frame.testing.cache.suite import CacheConformance

__all__ = ["CacheConformance", "CacheDriver", "CacheFactory", "check_reset", "prompt", "random_workload"]
