"""frame's Hermes tool-call parser (``--tool-parser hermes``)."""

from frame_tool_parser_hermes.parser import HermesToolParser

__all__ = ["HermesToolParser"]
