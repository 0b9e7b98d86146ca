"""Hook implementations of the hermes tool-call parser plugin."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.tool_parser import ToolParser
from pydantic import BaseModel

from frame_tool_parser_hermes.parser import HermesToolParser

FRAME_API_VERSION = 2


@hookimpl
def frame_tool_parser_create(options: BaseModel | None) -> ToolParser:
    """The parser (it takes no options)."""
    return HermesToolParser()
