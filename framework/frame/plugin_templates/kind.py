"""KindTemplate: what ``frame new-plugin`` writes for one plugin kind."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KindTemplate:
    """What ``frame new-plugin`` writes for one kind, and what its README says about it."""

    #: The module (beside ``plugin.py``) holding the kind's class.
    module: str
    plugin: str
    implementation: str
    tests: str
    #: Wheels the kind's conformance suite needs besides frame-engine and pytest.
    test_requires: tuple[str, ...]
    #: How a user selects the plugin, one Markdown paragraph.
    select: str
    #: Where the plugin runs, one Markdown paragraph.
    runs: str
    #: How users give the plugin's options, one Markdown sentence (default: its ``frame_plugin_options`` model's
    #: config section and flag).
    options: str = ""
