"""The hermes tool parser on scripted model outputs."""

from __future__ import annotations

import json

from frame_tool_parser_hermes import HermesToolParser

PARSER = HermesToolParser()


def test_one_call_and_no_content() -> None:
    out = PARSER.parse('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
                       '</tool_call>')
    assert out.content is None and len(out.calls) == 1
    assert out.calls[0].name == "get_weather"
    assert json.loads(out.calls[0].arguments) == {"city": "Paris", "unit": "celsius"}


def test_text_around_several_calls_and_other_spellings() -> None:
    text = ('Let me check both. <tool_call>{"name": "a", "parameters": {"x": 1}}</tool_call>'
            '<tool_call>{"name": "b", "arguments": "{\\"y\\": [2]}"}</tool_call> Done.')
    out = PARSER.parse(text)
    assert [c.name for c in out.calls] == ["a", "b"]
    assert json.loads(out.calls[1].arguments) == {"y": [2]}
    assert out.content == "Let me check both.  Done."


def test_malformed_blocks_stay_content() -> None:
    for text in ("<tool_call>{not json}</tool_call>", '<tool_call>{"arguments": {}}</tool_call>',
                 '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "plain answer"):
        out = PARSER.parse(text)
        assert out.calls == [] and out.content == text


def test_an_unclosed_block_at_the_end_still_counts() -> None:  # generation stopped at the call's end token
    out = PARSER.parse('<tool_call>{"name": "f", "arguments": {}}')
    assert [c.name for c in out.calls] == ["f"] and out.content is None


def test_streaming_never_shows_the_start_of_a_call() -> None:
    assert PARSER.stream_safe_prefix("Hello there") == len("Hello there")
    assert PARSER.stream_safe_prefix("Hello <tool") == len("Hello ")
    assert PARSER.stream_safe_prefix("Hello <tool_call>{") == len("Hello ")
    assert PARSER.stream_safe_prefix("Hello <b>") == len("Hello <b>")


def test_deeply_nested_or_huge_output_stays_content() -> None:
    """1,200 levels (past Python's recursion limit) or text past the size limit: content, not an exception."""
    from frame.interfaces.tool_parser import MAX_JSON_CHARS

    deep = "[" * 1200 + "]" * 1200
    for text in (f'<tool_call>{{"name": "f", "arguments": {{"x": {deep}}}}}</tool_call>',
                 f'<tool_call>{{"name": "f", "arguments": "{deep}"}}</tool_call>',
                 '<tool_call>{"name": "f", "arguments": {"x": "' + "a" * MAX_JSON_CHARS + '"}}</tool_call>'):
        out = PARSER.parse(text)
        assert out.calls == [] and out.content == text
    nested = "[" * 100 + "]" * 100  # deep, but within the limit: still a call
    out = PARSER.parse(f'<tool_call>{{"name": "f", "arguments": {{"x": {nested}}}}}</tool_call>')
    assert [c.name for c in out.calls] == ["f"] and out.calls[0].arguments.count("[") == 100
