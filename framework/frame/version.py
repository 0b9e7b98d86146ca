"""Versions: the core's release and the plugin API version that plugins declare against."""

__version__ = "0.1.0"

#: The plugin API version this core implements. A plugin module declares the version it was written for
#: as ``FRAME_API_VERSION``; the core loads it when that version is in ``SUPPORTED_API_VERSIONS``.
API_VERSION = 1
SUPPORTED_API_VERSIONS = frozenset({1})
