"""Moved to `tracefleet.formats.tool_parser` (shared by the engine and the proxy's exact mode)."""

from tracefleet.formats.tool_parser import (CLOSE, OPEN, ParsedToolCall, StreamingToolParser,  # noqa: F401
                                            new_tool_call_id, parse_tool_calls)
