"""OpenAI Chat Completions: `POST /v1/chat/completions` (Qwen Code, OpenCode, Pi)."""

from __future__ import annotations

from typing import Any

import orjson

from tracefleet.proxy.canonical import Conversation, Message, Part, Sampling, Tool, ToolCall
from tracefleet.proxy.errors import ProxyError
from tracefleet.proxy.token_engine import CallState
from tracefleet.proxy.dialects import SSE_COMMENT_PING, expect, object_entries, require_object, type_name, want

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool", "function": "tool"}

_ERROR_TYPES = {
    "invalid_request": ("invalid_request_error", None),
    "authentication": ("invalid_request_error", "invalid_api_key"),
    "permission": ("invalid_request_error", "permission_denied"),
    "not_found": ("invalid_request_error", "not_found"),
    "method_not_allowed": ("invalid_request_error", "method_not_allowed"),
    "too_large": ("invalid_request_error", "request_too_large"),
    "rate_limit": ("rate_limit_error", "rate_limit_exceeded"),
    "context_length": ("invalid_request_error", "context_length_exceeded"),
    "engine_4xx": ("invalid_request_error", None),
}


def openai_error(err: ProxyError) -> dict[str, Any]:
    etype, code = _ERROR_TYPES.get(err.kind, ("server_error", err.kind))
    return {"error": {"message": err.message, "type": etype, "param": err.param, "code": code}}


def content_parts(content: Any, where: str) -> list[Part]:
    """Chat `content`: a string or a list of text / image_url parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [Part(type="text", text=content)]
    expect(isinstance(content, list), f"invalid type for '{where}': expected string or array, got {type_name(content)}", where)
    parts: list[Part] = []
    for j, item in enumerate(content):
        p = f"{where}[{j}]"
        expect(isinstance(item, dict), f"invalid type for '{p}': expected object, got {type_name(item)}", p)
        kind = item.get("type")
        if kind in ("text", "input_text", "output_text"):
            text = item.get("text")
            expect(isinstance(text, str), f"invalid type for '{p}.text': expected string, got {type_name(text)}", p + ".text")
            parts.append(Part(type="text", text=text))
        elif kind == "image_url":
            img = item.get("image_url")
            url = img.get("url") if isinstance(img, dict) else img
            expect(isinstance(url, str), f"missing '{p}.image_url.url'", p + ".image_url")
            parts.append(Part(type="image", image_url=url))
        elif kind in ("reasoning", "thinking"):
            parts.append(Part(type="reasoning", text=str(item.get("text") or item.get("thinking") or "")))
        else:
            raise ProxyError("invalid_request", f"unsupported content part type {kind!r} at '{p}'", param=p)
    return parts


def parse_tools(tools: Any) -> list[Tool]:
    out: list[Tool] = []
    for p, t in object_entries(tools, "tools"):
        fn = t.get("function") if t.get("type", "function") == "function" else None
        expect(isinstance(fn, dict), f"'{p}': only function tools are supported (with a 'function' object)", p)
        name = fn.get("name")
        expect(isinstance(name, str) and bool(name), f"missing required field '{p}.function.name'", p + ".function.name")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        expect(isinstance(params, dict), f"invalid type for '{p}.function.parameters': expected object", p + ".function.parameters")
        out.append(Tool(name=name, description=fn.get("description"), parameters=params))
    return out


def parse_messages(messages: Any) -> list[Message]:
    expect(isinstance(messages, list), f"invalid type for 'messages': expected array, got {type_name(messages)}", "messages")
    expect(len(messages) > 0, "'messages' must contain at least one message", "messages")
    out: list[Message] = []
    for i, m in enumerate(messages):
        if type(m) is not dict or (role := _ROLES.get(m.get("role"))) is None:  # type: ignore[arg-type]
            w = f"messages[{i}]"
            expect(isinstance(m, dict), f"invalid type for '{w}': expected object, got {type_name(m)}", w)
            role = _ROLES.get(m.get("role"))  # type: ignore[arg-type]
            expect(role is not None, f"invalid value for '{w}.role': {m.get('role')!r} (expected system, developer, user, assistant or tool)", w + ".role")
        content = m.get("content")
        if role != "assistant" and type(content) is str:
            if role == "tool":
                call_id = m.get("tool_call_id") or m.get("name")
                if type(call_id) is str:
                    out.append(Message(role="tool", parts=[Part(type="tool_result", id=call_id, text=content)]))
                    continue
            else:
                out.append(Message(role=role, parts=[Part(type="text", text=content)]))
                continue
        w = f"messages[{i}]"
        if role == "tool":
            text = content if isinstance(content, str) else "".join(p.text or "" for p in content_parts(content, w + ".content"))
            call_id = m.get("tool_call_id") or m.get("name")
            expect(isinstance(call_id, str), f"missing required field '{w}.tool_call_id'", w + ".tool_call_id")
            out.append(Message(role="tool", parts=[Part(type="tool_result", id=call_id, text=text)]))
            continue
        parts: list[Part] = []
        if role == "assistant":
            reasoning = m.get("reasoning_content") or m.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                parts.append(Part(type="reasoning", text=reasoning))
        parts.extend(content_parts(m.get("content"), w + ".content"))
        if role == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            expect(isinstance(calls, list), f"invalid type for '{w}.tool_calls': expected array", w + ".tool_calls")
            for j, tc in enumerate(calls):
                p = f"{w}.tool_calls[{j}]"
                fn = tc.get("function") if isinstance(tc, dict) else None
                expect(isinstance(fn, dict) and isinstance(fn.get("name"), str), f"'{p}' needs a function with a name", p)
                args = fn.get("arguments", "")
                if not isinstance(args, str):
                    args = orjson.dumps(args).decode()
                parts.append(Part(type="tool_call", id=tc.get("id") or f"call_{i}_{j}", name=fn["name"], arguments=args))
        out.append(Message(role=role, parts=parts))
    return out


def sampling(body: dict[str, Any]) -> Sampling:
    stop = want(body, "stop", (str, list))
    max_tokens = want(body, "max_completion_tokens", (int,)) or want(body, "max_tokens", (int,))
    effort = body.get("reasoning_effort")
    return Sampling(
        max_tokens=max_tokens,
        temperature=want(body, "temperature", (float, int)),
        top_p=want(body, "top_p", (float, int)),
        top_k=want(body, "top_k", (int,)),
        seed=want(body, "seed", (int,)),
        stop=[stop] if isinstance(stop, str) else [str(s) for s in stop or ()],
        reasoning_effort=effort if isinstance(effort, str) else None,
    )


def tool_call_json(tc: ToolCall) -> dict[str, Any]:
    return {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments}}


class OpenAIChat:
    name = "openai-chat"

    def parse(self, body: Any, path_model: str | None = None) -> Conversation:
        body = require_object(body)
        model = want(body, "model", (str,))
        n = want(body, "n", (int,))
        expect(n in (None, 1), "'n' > 1 is not supported by this proxy", "n")
        messages = parse_messages(body.get("messages")) if "messages" in body else None
        expect(messages is not None, "missing required field 'messages'", "messages")
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            choice = {"name": (choice.get("function") or {}).get("name", "")}
        return Conversation(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            tools=parse_tools(body.get("tools")),
            tool_choice=choice,
            parallel_tool_calls=want(body, "parallel_tool_calls", (bool,)),
            sampling=sampling(body),
            stream=bool(want(body, "stream", (bool,))),
            options={"include_usage": bool((body.get("stream_options") or {}).get("include_usage"))},
        )

    def response(self, conv: Conversation, state: CallState) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": state.output_text or None}
        if state.reasoning:
            message["reasoning_content"] = state.reasoning_text
        if state.tool_calls:
            message["tool_calls"] = [tool_call_json(tc) for tc in state.tool_calls]
        return {
            "id": "chatcmpl-" + state.call_id,
            "object": "chat.completion",
            "created": int(state.received_at),
            "model": conv.model or state.engine_model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": state.finish_reason}],
            "usage": {
                "prompt_tokens": state.prompt_tokens,
                "completion_tokens": state.completion_tokens,
                "total_tokens": state.prompt_tokens + state.completion_tokens,
            },
        }

    def writer(self, conv: Conversation, state: CallState) -> ChatStream:
        return ChatStream(conv, state)

    def error_body(self, err: ProxyError) -> dict[str, Any]:
        return openai_error(err)


class ChatStream:
    def __init__(self, conv: Conversation, state: CallState) -> None:
        self.state = state
        self._usage = bool(conv.options.get("include_usage"))
        self._head = {
            "id": "chatcmpl-" + state.call_id,
            "object": "chat.completion.chunk",
            "created": int(state.received_at),
            "model": conv.model or state.engine_model,
        }
        self._prefix = b"data: " + orjson.dumps(self._head)[:-1] + b',"choices":[{"index":0,"delta":'
        self._tools = 0

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        if finish is None:  # the per-token case: the same bytes orjson would write for the whole chunk
            return self._prefix + orjson.dumps(delta) + b',"logprobs":null,"finish_reason":null}]}\n\n'
        data = dict(self._head)
        data["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        return b"data: " + orjson.dumps(data) + b"\n\n"

    def start(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def text(self, delta: str) -> bytes:
        return self._chunk({"content": delta})

    def reasoning(self, delta: str) -> bytes:
        return self._chunk({"reasoning_content": delta})

    def tool_call(self, call: ToolCall) -> bytes:
        index = self._tools
        self._tools += 1
        return self._chunk({"tool_calls": [{"index": index, **tool_call_json(call)}]})

    def end(self) -> bytes:
        s = self.state
        usage = dict(self._head)
        usage["choices"] = []
        usage["usage"] = {
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens,
            "total_tokens": s.prompt_tokens + s.completion_tokens,
        }
        tail = b"data: " + orjson.dumps(usage) + b"\n\n" if self._usage else b""
        return self._chunk({}, s.finish_reason) + tail + b"data: [DONE]\n\n"

    def error(self, err: ProxyError) -> bytes:
        return b"data: " + orjson.dumps(openai_error(err)) + b"\n\n"

    def ping(self) -> bytes:
        return SSE_COMMENT_PING
