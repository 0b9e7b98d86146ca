"""Versions: the core's release and the plugin API version that plugins declare against."""

__version__ = "0.1.0"

#: The plugin API version this core implements. A plugin module declares the version it was written for
#: as ``FRAME_API_VERSION``; the core loads it when that version is in ``SUPPORTED_API_VERSIONS``.
API_VERSION = 2
SUPPORTED_API_VERSIONS = frozenset({2})

#: For each older API, what changed since, as the clause the registry's refusal quotes.
API_CHANGES = {
    1: "scheduler plugins now return a SchedulingPolicy, cache strategies implement the strategy half of the "
       "core's KVCacheStrategy base, and attention backends build typed metadata in build_metadata() instead of "
       "filling meta.extras",
}
