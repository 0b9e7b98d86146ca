"""Conformance suite for tool-call parser plugins: subclass :class:`ToolParserConformance`.

A subclass provides ``make_parser`` and :meth:`ToolParserConformance.call_text` (how a model writes one call in the
parser's format); the suite round-trips calls with text around them, checks that plain text has no calls and
stays whole, and that streaming never releases a character of a call as content. With ``plugin_module`` and
``plugin_name`` set it also creates the parser through the plugin's hooks, with its options' defaults.
"""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from frame.interfaces.tool_parser import ParsedText, ToolCall, ToolParser

CALLS = [("get_weather", {"city": "Paris", "days": 3}), ("search", {"query": "frame \"engine\"", "tags": ["a", "b"]})]


class ToolParserConformance:
    """The contract of :class:`~frame.interfaces.tool_parser.ToolParser`."""

    #: The plugin's module and name; when set, the suite also creates the parser through its hooks.
    plugin_module: ModuleType | None = None
    plugin_name: str = ""

    @pytest.fixture
    def make_parser(self):
        pytest.fail(f"{type(self).__name__} must define make_parser: () -> ToolParser")

    def call_text(self, name: str, arguments: dict) -> str:
        """One call as the model writes it in this parser's format."""
        raise NotImplementedError(f"{type(self).__name__} must say how a call is written (call_text)")

    def test_plain_text_has_no_calls(self, make_parser) -> None:
        parser: ToolParser = make_parser()
        for text in ("The answer is 42.", "Use {braces} and <tags> freely.", ""):
            assert parser.parse(text) == ParsedText(text or None, [])

    def test_calls_round_trip_with_text_around_them(self, make_parser) -> None:
        parser: ToolParser = make_parser()
        text = "Checking. " + "".join(self.call_text(n, a) for n, a in CALLS)
        parsed = parser.parse(text)
        assert parsed.content == "Checking."
        assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == CALLS
        alone = parser.parse(self.call_text(*CALLS[0]))
        assert alone.content is None and alone.calls == [ToolCall(CALLS[0][0], json.dumps(CALLS[0][1]))]

    def test_streaming_never_releases_part_of_a_call(self, make_parser) -> None:
        parser: ToolParser = make_parser()
        content = "Let me look that up. "
        text = content + self.call_text(*CALLS[1])
        last = 0
        for end in range(len(text) + 1):
            safe = parser.stream_safe_prefix(text[:end])
            assert 0 <= safe <= end and safe <= len(content), (end, safe)
            assert safe >= last or end < last, "the safe prefix shrank as text grew"
            last = max(last, safe)
        assert parser.stream_safe_prefix(content) >= len(content.rstrip()) - 1

    def test_created_through_the_plugin_hooks(self) -> None:
        if self.plugin_module is None:
            pytest.skip("set plugin_module and plugin_name to check registration and the create hook")
        from frame.testing.registration import plugin_hooks

        with plugin_hooks("tool_parser", self.plugin_name, self.plugin_module) as (hooks, options):
            parser = hooks.create_tool_parser(self.plugin_name, options)
            assert isinstance(parser, ToolParser)
            parsed = parser.parse(self.call_text(*CALLS[0]))
            assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [CALLS[0]]
