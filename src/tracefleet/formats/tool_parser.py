"""Hermes tool calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) in sampled text, in the
shape the tracefleet engine's chat route streams them.

There is one hermes parser: `parsers.TaggedParser`, which the proxy's exact mode uses. This module only
adapts its events to `(text, calls)` pairs with OpenAI tool-call ids, so the engine and exact mode cannot
disagree on what a call is.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from tracefleet.formats.parsers import CALL_CLOSE as CLOSE
from tracefleet.formats.parsers import CALL_OPEN as OPEN
from tracefleet.formats.parsers import Event, TaggedParser

__all__ = ["CLOSE", "OPEN", "ParsedToolCall", "StreamingToolParser", "new_tool_call_id", "parse_tool_calls"]


@dataclass
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out["index"] = index
        return out


def new_tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex[:24]}"


def parse_tool_calls(text: str) -> tuple[str, list[ParsedToolCall]]:
    """(content before/around the calls, calls). Unparseable blocks stay in the content."""
    parser = StreamingToolParser()
    content, calls = parser.feed(text)
    tail, more = parser.finish()
    return content + tail, calls + more


class StreamingToolParser:
    def __init__(self) -> None:
        self._parser = TaggedParser()
        self.calls: list[ParsedToolCall] = []

    def _split(self, events: list[Event]) -> tuple[str, list[ParsedToolCall]]:
        text: list[str] = []
        calls: list[ParsedToolCall] = []
        for ev in events:
            if ev.call is not None:
                calls.append(ParsedToolCall(new_tool_call_id(), ev.call.name, ev.call.arguments))
            else:
                text.append(ev.text)
        self.calls.extend(calls)
        return "".join(text), calls

    def feed(self, delta: str) -> tuple[str, list[ParsedToolCall]]:
        """Text safe to show now, and calls completed by this delta."""
        return self._split(self._parser.feed(delta))

    def finish(self) -> tuple[str, list[ParsedToolCall]]:
        """At end of generation: an unterminated call whose JSON is complete still counts (EOS before the tag)."""
        return self._split(self._parser.finish())
