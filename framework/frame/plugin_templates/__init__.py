"""Source templates for ``frame new-plugin``, one set per kind (``str.format`` fields in braces, ``{{`` escapes).

``{api_version}`` is the core's ``frame.version.API_VERSION``: a skeleton declares the plugin API of the core that
wrote it.

Every kind gets the same shape: ``plugin.py`` (the hooks and ``FRAME_API_VERSION``), one module holding the
kind's class, and ``tests/test_conformance.py`` running the kind's conformance suite. The files shared by every
kind (pyproject, README, conftest) are in :mod:`frame.cli.new_plugin`.
"""

from __future__ import annotations

from frame.plugin_templates.bookkeeping import CACHE, PROPOSER, SCHEDULER
from frame.plugin_templates.host import GRAMMAR, TOOL_PARSER
from frame.plugin_templates.kind import KindTemplate
from frame.plugin_templates.quantization import QUANTIZATION
from frame.plugin_templates.routing import ROUTER
from frame.plugin_templates.tensors import ATTENTION, MODEL, PLATFORM
from frame.plugin_templates.workload import WORKLOAD

TEMPLATES: dict[str, KindTemplate] = {
    "scheduler": SCHEDULER,
    "cache": CACHE,
    "attention": ATTENTION,
    "platform": PLATFORM,
    "model": MODEL,
    "proposer": PROPOSER,
    "grammar": GRAMMAR,
    "tool_parser": TOOL_PARSER,
    "router": ROUTER,
    "quantization": QUANTIZATION,
    "workload": WORKLOAD,
}

__all__ = ["ATTENTION", "CACHE", "GRAMMAR", "MODEL", "PLATFORM", "PROPOSER", "QUANTIZATION", "ROUTER", "SCHEDULER",
           "TEMPLATES", "TOOL_PARSER", "WORKLOAD", "KindTemplate"]
