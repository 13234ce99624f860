"""Anthropic Messages: `POST /v1/messages` (Claude Code, Pi) and `/v1/messages/count_tokens`.

Thinking blocks the harness sends back keep their signature verbatim. Thinking the engine produces
is signed with an explicit tracefleet placeholder, never something passing as Anthropic's.
"""

from __future__ import annotations

from typing import Any

import orjson

from tracefleet.proxy.canonical import Conversation, Message, Part, Sampling, Tool, ToolCall
from tracefleet.proxy.errors import ProxyError
from tracefleet.proxy.token_engine import CallState
from tracefleet.proxy.dialects import expect, object_entries, parse_arguments, require_object, sse, type_name, want

TRACEFLEET_SIGNATURE = "tracefleet-unsigned"

_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "context_length": "invalid_request_error",
    "engine_4xx": "invalid_request_error",
    "method_not_allowed": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "too_large": "request_too_large",
    "rate_limit": "rate_limit_error",
    "engine_timeout": "timeout_error",
    "engine_unavailable": "overloaded_error",
    "proxy_shutdown": "overloaded_error",  # what Claude Code retries
}

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}


def anthropic_error(err: ProxyError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(err.kind, "api_error"), "message": err.message}}


def _image(block: dict[str, Any], where: str) -> Part:
    src = block.get("source")
    expect(isinstance(src, dict), f"missing required field '{where}.source'", where + ".source")
    if src.get("type") == "base64":
        media = src.get("media_type", "image/png")
        return Part(type="image", image_url=f"data:{media};base64,{src.get('data', '')}", media_type=media)
    expect(src.get("type") == "url" and isinstance(src.get("url"), str), f"unsupported image source at '{where}.source'", where)
    return Part(type="image", image_url=src["url"])


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    expect(isinstance(content, list), f"invalid type for '{where}': expected string or array, got {type_name(content)}", where)
    for j, b in enumerate(content):
        expect(isinstance(b, dict) and isinstance(b.get("type"), str), f"'{where}[{j}]' must be an object with a 'type'", f"{where}[{j}]")
    return content


def _tool_result_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for b in _blocks(content, where):
        if b["type"] == "text":
            texts.append(str(b.get("text", "")))
        else:
            texts.append(f"[{b['type']}]")
    return "\n".join(texts)


def parse_messages(messages: Any) -> list[Message]:
    """Canonical messages; role:"system" entries inside `messages` (Claude Code sends them) stay in place."""
    expect(isinstance(messages, list), f"invalid type for 'messages': expected array, got {type_name(messages)}", "messages")
    out: list[Message] = []
    for i, m in enumerate(messages):
        w = f"messages[{i}]"
        expect(isinstance(m, dict), f"invalid type for '{w}': expected object, got {type_name(m)}", w)
        role = m.get("role")
        expect(role in ("user", "assistant", "system"), f"invalid value for '{w}.role': {role!r} (expected user, assistant or system)", w + ".role")
        expect("content" in m, f"missing required field '{w}.content'", w + ".content")
        pending: list[Part] = []

        for j, b in enumerate(_blocks(m["content"], w + ".content")):
            p = f"{w}.content[{j}]"
            kind = b["type"]
            if kind == "text":
                expect(isinstance(b.get("text"), str), f"invalid type for '{p}.text': expected string", p + ".text")
                pending.append(Part(type="text", text=b["text"]))
            elif kind == "image":
                pending.append(_image(b, p))
            elif kind == "thinking":
                pending.append(Part(type="reasoning", text=str(b.get("thinking", "")), signature=b.get("signature")))
            elif kind == "redacted_thinking":
                pending.append(Part(type="reasoning", text="", signature=b.get("data"), redacted=True))
            elif kind in ("tool_use", "server_tool_use"):
                expect(isinstance(b.get("name"), str), f"missing required field '{p}.name'", p + ".name")
                args = b.get("input", {})
                pending.append(Part(type="tool_call", id=str(b.get("id", f"toolu_{i}_{j}")), name=b["name"],
                                    arguments=orjson.dumps(args).decode()))
            elif kind == "tool_result":
                expect(isinstance(b.get("tool_use_id"), str), f"missing required field '{p}.tool_use_id'", p + ".tool_use_id")
                _flush(out, role, pending)
                out.append(Message(role="tool", parts=[Part(
                    type="tool_result", id=b["tool_use_id"], text=_tool_result_text(b.get("content"), p + ".content"),
                    is_error=bool(b.get("is_error")))]))
            elif kind == "document":
                src = b.get("source") or {}
                pending.append(Part(type="text", text=str(src.get("data", "")) if src.get("type") == "text" else "[document]"))
            else:
                raise ProxyError("invalid_request", f"unsupported content block type {kind!r} at '{p}'", param=p)
        _flush(out, role, pending)
    return out


def _flush(out: list[Message], role: str, pending: list[Part]) -> None:
    """Close the message being built (tool results split a user message into tool + user turns)."""
    if pending:
        out.append(Message(role=role, parts=list(pending)))  # type: ignore[arg-type]
        pending.clear()


def parse_system(system: Any) -> list[Part]:
    if system is None:
        return []
    if isinstance(system, str):
        return [Part(type="text", text=system)]
    expect(isinstance(system, list), f"invalid type for 'system': expected string or array, got {type_name(system)}", "system")
    parts = []
    for j, b in enumerate(system):
        expect(isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str),
               f"'system[{j}]' must be a text block", f"system[{j}]")
        parts.append(Part(type="text", text=b["text"]))
    return parts


def parse_tools(tools: Any) -> list[Tool]:
    out = []
    for p, t in object_entries(tools, "tools"):
        if t.get("type") not in (None, "custom") and "input_schema" not in t:
            continue  # Anthropic-hosted server tools (web search, ...) cannot run here
        expect(isinstance(t.get("name"), str) and bool(t["name"]), f"missing required field '{p}.name'", p + ".name")
        schema = t.get("input_schema")
        expect(isinstance(schema, dict), f"missing required field '{p}.input_schema'", p + ".input_schema")
        out.append(Tool(name=t["name"], description=t.get("description"), parameters=schema))
    return out


def tool_use_block(tc: ToolCall) -> tuple[dict[str, Any], str | None]:
    args, problem = parse_arguments(tc.arguments)
    return {"type": "tool_use", "id": tc.id, "name": tc.name, "input": args}, problem


class Anthropic:
    name = "anthropic"

    def parse(self, body: Any, path_model: str | None = None, *, count_only: bool = False) -> Conversation:
        body = require_object(body)
        model = want(body, "model", (str,), required=True)
        max_tokens = want(body, "max_tokens", (int,), required=not count_only)
        expect("messages" in body, "missing required field 'messages'", "messages")
        messages = parse_messages(body["messages"])
        system = parse_system(body.get("system"))
        if system:
            messages.insert(0, Message(role="system", parts=system))
        stop = want(body, "stop_sequences", (list,)) or []
        thinking = want(body, "thinking", (dict,)) or {}
        choice = want(body, "tool_choice", (dict,))
        tool_choice: Any = None
        if choice:
            tool_choice = {"auto": "auto", "any": "required", "none": "none"}.get(choice.get("type"), None)
            if choice.get("type") == "tool":
                tool_choice = {"name": choice.get("name", "")}
        return Conversation(
            model=model,
            messages=messages,
            tools=parse_tools(body.get("tools")),
            tool_choice=tool_choice,
            parallel_tool_calls=None if not choice else not choice.get("disable_parallel_tool_use", False),
            sampling=Sampling(
                max_tokens=max_tokens,
                temperature=want(body, "temperature", (float, int)),
                top_p=want(body, "top_p", (float, int)),
                top_k=want(body, "top_k", (int,)),
                stop=[str(s) for s in stop],
                reasoning_effort=str(thinking.get("budget_tokens")) if thinking.get("type") == "enabled" else None,
            ),
            stream=bool(want(body, "stream", (bool,))),
        )

    def response(self, conv: Conversation, state: CallState) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if state.reasoning:
            content.append({"type": "thinking", "thinking": state.reasoning_text, "signature": TRACEFLEET_SIGNATURE})
        if state.text:
            content.append({"type": "text", "text": state.output_text})
        for tc in state.tool_calls:
            block, problem = tool_use_block(tc)
            if problem:
                state.tool_parse_errors.append(f"{tc.name} ({tc.id}): {problem}")
            content.append(block)
        return {
            "id": "msg_" + state.call_id,
            "type": "message",
            "role": "assistant",
            "model": conv.model or state.engine_model,
            "content": content,
            "stop_reason": _STOP.get(state.finish_reason or "stop", "end_turn"),
            "stop_sequence": None,
            "usage": {
                "input_tokens": state.prompt_tokens,
                "output_tokens": state.completion_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }

    def writer(self, conv: Conversation, state: CallState) -> AnthropicStream:
        return AnthropicStream(conv, state)

    def error_body(self, err: ProxyError) -> dict[str, Any]:
        return anthropic_error(err)


_PING = sse("ping", {"type": "ping"})


class AnthropicStream:
    def __init__(self, conv: Conversation, state: CallState) -> None:
        self.conv = conv
        self.state = state
        self._index = -1
        self._open: str | None = None  # type of the open content block

    def _start_block(self, block: dict[str, Any]) -> bytes:
        out = self._close_block()
        self._index += 1
        self._open = block["type"]
        return out + sse("content_block_start", {"type": "content_block_start", "index": self._index, "content_block": block})

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        out = b""
        if self._open == "thinking":
            out = sse("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                              "delta": {"type": "signature_delta", "signature": TRACEFLEET_SIGNATURE}})
        self._open = None
        return out + sse("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def start(self) -> bytes:
        s = self.state
        message = {
            "id": "msg_" + s.call_id, "type": "message", "role": "assistant", "model": self.conv.model or s.engine_model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": len(s.prompt_ids), "output_tokens": 1,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }
        return sse("message_start", {"type": "message_start", "message": message}) + _PING

    def text(self, delta: str) -> bytes:
        out = b"" if self._open == "text" else self._start_block({"type": "text", "text": ""})
        return out + sse("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                 "delta": {"type": "text_delta", "text": delta}})

    def reasoning(self, delta: str) -> bytes:
        out = b"" if self._open == "thinking" else self._start_block({"type": "thinking", "thinking": "", "signature": ""})
        return out + sse("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                 "delta": {"type": "thinking_delta", "thinking": delta}})

    def tool_call(self, call: ToolCall) -> bytes:
        block, problem = tool_use_block(call)
        if problem:
            self.state.tool_parse_errors.append(f"{call.name} ({call.id}): {problem}")
        out = self._start_block({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
        out += sse("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                           "delta": {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}})
        return out + self._close_block()

    def end(self) -> bytes:
        s = self.state
        out = self._close_block()
        out += sse("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": _STOP.get(s.finish_reason or "stop", "end_turn"), "stop_sequence": None},
            "usage": {"input_tokens": s.prompt_tokens, "output_tokens": s.completion_tokens},
        })
        return out + sse("message_stop", {"type": "message_stop"})

    def error(self, err: ProxyError) -> bytes:
        return sse("error", anthropic_error(err))

    def ping(self) -> bytes:
        return _PING
