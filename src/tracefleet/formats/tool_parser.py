"""Hermes tool calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) in sampled text.

Both shipped templates teach this format, the scripted backend emits it, and it is what vLLM's
`hermes` parser reads. The streaming parser holds back only text that could still become a tag.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"


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


def parse_call_body(body: str) -> ParsedToolCall | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ParsedToolCall(new_tool_call_id(), obj["name"], args_text)


def parse_tool_calls(text: str) -> tuple[str, list[ParsedToolCall]]:
    """(content before/around the calls, calls). Unparseable blocks stay in the content."""
    parser = StreamingToolParser()
    content, calls = parser.feed(text)
    tail, more = parser.finish()
    return content + tail, calls + more


class StreamingToolParser:
    def __init__(self) -> None:
        self.buf = ""
        self.in_call = False
        self.calls: list[ParsedToolCall] = []

    def feed(self, delta: str) -> tuple[str, list[ParsedToolCall]]:
        """Text safe to show now, and calls completed by this delta."""
        self.buf += delta
        out: list[str] = []
        calls: list[ParsedToolCall] = []
        while True:
            if self.in_call:
                end = self.buf.find(CLOSE)
                if end < 0:
                    break
                body = self.buf[:end]
                self.buf = self.buf[end + len(CLOSE):]
                self.in_call = False
                call = parse_call_body(body.strip())
                if call is None:  # not a call after all: show it as text
                    out.append(OPEN + body + CLOSE)
                else:
                    calls.append(call)
                    self.calls.append(call)
                continue
            start = self.buf.find(OPEN)
            if start >= 0:
                if not (self.calls and not self.buf[:start].strip()):
                    out.append(self.buf[:start])
                self.buf = self.buf[start + len(OPEN):]
                self.in_call = True
                continue
            keep = _partial_suffix(self.buf, OPEN)
            if self.calls and not self.buf[:len(self.buf) - keep].strip():
                keep = len(self.buf)  # whitespace between or after calls is not content
            out.append(self.buf[:len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep:]
            break
        return "".join(out), calls

    def finish(self) -> tuple[str, list[ParsedToolCall]]:
        """At end of generation: an unterminated call whose JSON is complete still counts (EOS before the tag)."""
        rest, self.buf = self.buf, ""
        if self.in_call:
            self.in_call = False
            call = parse_call_body(rest.strip())
            if call is not None:
                self.calls.append(call)
                return "", [call]
            return OPEN + rest, []
        if self.calls and not rest.strip():
            return "", []
        return rest, []


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
