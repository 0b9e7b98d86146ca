"""Hooks of tool-call parser plugins (entry-point group ``frame.tool_parsers``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from frame.hookspecs import hookspec

if TYPE_CHECKING:
    from frame.interfaces.tool_parser import ToolParser


@hookspec
def frame_tool_parser_create(options: BaseModel | None) -> ToolParser:
    """Create the parser that finds tool calls in generated text (``--tool-parser``, in-tree ``hermes``).

    Called once by the API server at start, when it serves chat completions with ``tools`` and ``tool_choice``
    ``auto``. ``options`` is the plugin's options instance or None. Since API 2.
    """
