"""frame's tool-parser conformance suite, run on the hermes parser."""

from __future__ import annotations

import json

import pytest
from frame.testing.tool_parser import ToolParserConformance
from frame_tool_parser_hermes import HermesToolParser, plugin


class TestHermesConformance(ToolParserConformance):
    plugin_module = plugin
    plugin_name = "hermes"

    @pytest.fixture
    def make_parser(self):
        return HermesToolParser

    def call_text(self, name: str, arguments: dict) -> str:
        return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"
