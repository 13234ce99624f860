"""OpenAI Responses: `POST /v1/responses` (Codex CLI speaks only this; Pi optionally).

Stateless (`store: false`): the harness sends the whole history each turn, reasoning items
included. Reasoning the engine produced is handed out with an `encrypted_content` that is plainly
ours (`tfr1.` + base64 of the text), so when it comes back we recover the exact text; any other
encrypted blob is kept verbatim as an opaque signature.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from tracefleet.proxy.canonical import Conversation, Message, Part, Sampling, Tool, ToolCall
from tracefleet.proxy.errors import ProxyError
from tracefleet.proxy.token_engine import CallState
from tracefleet.proxy.dialects import SSE_COMMENT_PING, expect, object_entries, require_object, type_name, want
from tracefleet.proxy.dialects.openai_chat import openai_error

REASONING_PREFIX = "tfr1."
_SKIPPED_ITEMS = {"web_search_call", "file_search_call", "image_generation_call", "computer_call", "computer_call_output",
                  "mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response", "item_reference"}


def encode_reasoning(text: str) -> str:
    return REASONING_PREFIX + base64.urlsafe_b64encode(text.encode()).decode()


def decode_reasoning(blob: str | None) -> str | None:
    if not blob or not blob.startswith(REASONING_PREFIX):
        return None
    try:
        return base64.urlsafe_b64decode(blob[len(REASONING_PREFIX):]).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def _content(content: Any, where: str) -> list[Part]:
    if isinstance(content, str):
        return [Part(type="text", text=content)]
    expect(isinstance(content, list), f"invalid type for '{where}': expected string or array, got {type_name(content)}", where)
    parts = []
    for j, c in enumerate(content):
        p = f"{where}[{j}]"
        expect(isinstance(c, dict), f"invalid type for '{p}': expected object, got {type_name(c)}", p)
        kind = c.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            expect(isinstance(c.get("text"), str), f"invalid type for '{p}.text': expected string", p + ".text")
            parts.append(Part(type="text", text=c["text"]))
        elif kind == "input_image":
            url = c.get("image_url")
            expect(isinstance(url, str), f"'{p}': input_image needs an image_url (file ids are not supported)", p)
            parts.append(Part(type="image", image_url=url))
        elif kind == "refusal":
            parts.append(Part(type="text", text=str(c.get("refusal", ""))))
        else:
            raise ProxyError("invalid_request", f"unsupported content type {kind!r} at '{p}'", param=p)
    return parts


def _output_text(output: Any, where: str) -> str:
    if isinstance(output, str):
        return output
    return "".join(p.text or "" for p in _content(output, where) if p.type == "text")


def parse_input(items: Any) -> list[Message]:
    if isinstance(items, str):
        return [Message(role="user", parts=[Part(type="text", text=items)])]
    expect(isinstance(items, list), f"invalid type for 'input': expected string or array, got {type_name(items)}", "input")
    out: list[Message] = []

    def assistant() -> Message:
        if not out or out[-1].role != "assistant":
            out.append(Message(role="assistant"))
        return out[-1]

    for i, item in enumerate(items):
        w = f"input[{i}]"
        expect(isinstance(item, dict), f"invalid type for '{w}': expected object, got {type_name(item)}", w)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            expect(role in ("user", "assistant", "system", "developer"),
                   f"invalid value for '{w}.role': {role!r} (expected user, assistant, system or developer)", w + ".role")
            parts = _content(item.get("content", ""), w + ".content")
            if role == "assistant":
                assistant().parts.extend(parts)
            else:
                out.append(Message(role="system" if role == "developer" else role, parts=parts))
        elif kind in ("function_call", "custom_tool_call"):
            expect(isinstance(item.get("name"), str), f"missing required field '{w}.name'", w + ".name")
            expect(isinstance(item.get("call_id"), str), f"missing required field '{w}.call_id'", w + ".call_id")
            custom = kind == "custom_tool_call"
            args = item.get("input" if custom else "arguments", "")
            expect(isinstance(args, str), f"invalid type for '{w}.{'input' if custom else 'arguments'}': expected string", w)
            assistant().parts.append(Part(type="tool_call", id=item["call_id"], name=item["name"], arguments=args,
                                          kind="custom" if custom else "function"))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            expect(isinstance(item.get("call_id"), str), f"missing required field '{w}.call_id'", w + ".call_id")
            out.append(Message(role="tool", parts=[Part(type="tool_result", id=item["call_id"],
                                                         text=_output_text(item.get("output", ""), w + ".output"))]))
        elif kind == "reasoning":
            blob = item.get("encrypted_content")
            text = decode_reasoning(blob)
            if text is None:
                pieces = item.get("content") or item.get("summary") or []
                text = "".join(str(p.get("text", "")) for p in pieces if isinstance(p, dict))
            assistant().parts.append(Part(type="reasoning", text=text, signature=blob, id=item.get("id")))
        elif kind in _SKIPPED_ITEMS:
            continue
        else:
            raise ProxyError("invalid_request", f"unsupported input item type {kind!r} at '{w}'", param=w)
    return out


def parse_tools(tools: Any) -> list[Tool]:
    out = []
    for p, t in object_entries(tools, "tools"):
        kind = t.get("type")
        if kind not in ("function", "custom"):
            continue  # hosted tools (web_search, file_search, local_shell, ...) cannot run here
        expect(isinstance(t.get("name"), str) and bool(t["name"]), f"missing required field '{p}.name'", p + ".name")
        params = t.get("parameters") or {"type": "object", "properties": {}}
        expect(isinstance(params, dict), f"invalid type for '{p}.parameters': expected object", p + ".parameters")
        out.append(Tool(name=t["name"], description=t.get("description"), parameters=params if kind == "function" else {},
                        kind=kind))
    return out


def _tool_item(tc: ToolCall, status: str = "completed") -> dict[str, Any]:
    if tc.kind == "custom":
        return {"type": "custom_tool_call", "id": "ctc_" + tc.id, "call_id": tc.id, "name": tc.name,
                "input": tc.arguments if status == "completed" else "", "status": status}
    return {"type": "function_call", "id": "fc_" + tc.id, "call_id": tc.id, "name": tc.name,
            "arguments": tc.arguments if status == "completed" else "", "status": status}


class OpenAIResponses:
    name = "openai-responses"

    def parse(self, body: Any, path_model: str | None = None) -> Conversation:
        body = require_object(body)
        model = want(body, "model", (str,))
        expect("input" in body, "missing required field 'input'", "input")
        expect(not body.get("previous_response_id"),
               "'previous_response_id' is not supported: responses are not stored; send the full input (store: false)",
               "previous_response_id")
        messages = parse_input(body["input"])
        instructions = want(body, "instructions", (str,))
        if instructions:
            messages.insert(0, Message(role="system", parts=[Part(type="text", text=instructions)]))
        expect(bool(messages), "'input' must contain at least one item", "input")
        reasoning = want(body, "reasoning", (dict,)) or {}
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            choice = {"name": choice.get("name", "")}
        include = want(body, "include", (list,)) or []
        return Conversation(
            model=model,
            messages=messages,
            tools=parse_tools(body.get("tools")),
            tool_choice=choice,
            parallel_tool_calls=want(body, "parallel_tool_calls", (bool,)),
            sampling=Sampling(
                max_tokens=want(body, "max_output_tokens", (int,)),
                temperature=want(body, "temperature", (float, int)),
                top_p=want(body, "top_p", (float, int)),
                reasoning_effort=reasoning.get("effort"),
            ),
            stream=bool(want(body, "stream", (bool,))),
            options={
                "encrypted_reasoning": "reasoning.encrypted_content" in include,
                "reasoning": reasoning,
                "instructions": instructions,
                "store": body.get("store", False),
                "metadata": body.get("metadata") or {},
                "tool_choice": body.get("tool_choice", "auto"),
                "tools": body.get("tools") or [],
            },
        )

    def envelope(self, conv: Conversation, state: CallState, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        o = conv.options
        usage = None
        if status == "completed":
            usage = {
                "input_tokens": state.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": state.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": state.prompt_tokens + state.completion_tokens,
            }
        incomplete = {"reason": "max_output_tokens"} if state.finish_reason == "length" and status != "in_progress" else None
        return {
            "id": "resp_" + state.call_id,
            "object": "response",
            "created_at": int(state.received_at),
            "status": "incomplete" if incomplete and status == "completed" else status,
            "background": False,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": o.get("instructions"),
            "max_output_tokens": conv.sampling.max_tokens,
            "model": conv.model or state.engine_model,
            "output": output,
            "parallel_tool_calls": conv.parallel_tool_calls if conv.parallel_tool_calls is not None else True,
            "previous_response_id": None,
            "reasoning": {"effort": o.get("reasoning", {}).get("effort"), "summary": o.get("reasoning", {}).get("summary")},
            "store": bool(o.get("store")),
            "temperature": conv.sampling.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": o.get("tool_choice", "auto"),
            "tools": o.get("tools", []),
            "top_p": conv.sampling.top_p,
            "truncation": "disabled",
            "usage": usage,
            "metadata": o.get("metadata", {}),
        }

    def reasoning_item(self, conv: Conversation, state: CallState) -> dict[str, Any]:
        item: dict[str, Any] = {"type": "reasoning", "id": "rs_" + state.call_id,
                                "summary": [{"type": "summary_text", "text": state.reasoning_text}]}
        if conv.options.get("encrypted_reasoning"):
            item["encrypted_content"] = encode_reasoning(state.reasoning_text)
        return item

    def message_item(self, state: CallState, status: str = "completed") -> dict[str, Any]:
        text = state.output_text if status == "completed" else ""
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
        return {"type": "message", "id": "msg_" + state.call_id, "status": status, "role": "assistant", "content": content}

    def response(self, conv: Conversation, state: CallState) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if state.reasoning:
            output.append(self.reasoning_item(conv, state))
        if state.text:
            output.append(self.message_item(state))
        output.extend(_tool_item(tc) for tc in state.tool_calls)
        return self.envelope(conv, state, "completed", output)

    def writer(self, conv: Conversation, state: CallState) -> ResponsesStream:
        return ResponsesStream(self, conv, state)

    def error_body(self, err: ProxyError) -> dict[str, Any]:
        return openai_error(err)


class ResponsesStream:
    def __init__(self, dialect: OpenAIResponses, conv: Conversation, state: CallState) -> None:
        self.d = dialect
        self.conv = conv
        self.state = state
        self._seq = 0
        self._open: str | None = None  # "reasoning" | "message"
        self._index = -1
        self._output: list[dict[str, Any]] = []
        self._item_id = ""

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        data["type"] = kind
        data["sequence_number"] = self._seq
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def start(self) -> bytes:
        env = self.d.envelope(self.conv, self.state, "in_progress", [])
        return self._event("response.created", {"response": env}) + self._event("response.in_progress", {"response": env})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        s, i, iid = self.state, self._index, self._item_id
        if self._open == "reasoning":
            text = s.reasoning_text
            part = {"type": "summary_text", "text": text}
            item = self.d.reasoning_item(self.conv, s)
            out = self._event("response.reasoning_summary_text.done", {"item_id": iid, "output_index": i, "summary_index": 0, "text": text})
            out += self._event("response.reasoning_summary_part.done", {"item_id": iid, "output_index": i, "summary_index": 0, "part": part})
        else:
            text = s.output_text
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item = self.d.message_item(s)
            out = self._event("response.output_text.done", {"item_id": iid, "output_index": i, "content_index": 0, "text": text, "logprobs": []})
            out += self._event("response.content_part.done", {"item_id": iid, "output_index": i, "content_index": 0, "part": part})
        self._output.append(item)
        self._open = None
        return out + self._event("response.output_item.done", {"output_index": i, "item": item})

    def reasoning(self, delta: str) -> bytes:
        out = b""
        if self._open != "reasoning":
            out = self._close()
            self._index += 1
            self._open = "reasoning"
            self._item_id = "rs_" + self.state.call_id
            item = {"type": "reasoning", "id": self._item_id, "summary": []}
            out += self._event("response.output_item.added", {"output_index": self._index, "item": item})
            out += self._event("response.reasoning_summary_part.added", {
                "item_id": self._item_id, "output_index": self._index, "summary_index": 0,
                "part": {"type": "summary_text", "text": ""}})
        return out + self._event("response.reasoning_summary_text.delta", {
            "item_id": self._item_id, "output_index": self._index, "summary_index": 0, "delta": delta})

    def text(self, delta: str) -> bytes:
        out = b""
        if self._open != "message":
            out = self._close()
            self._index += 1
            self._open = "message"
            self._item_id = "msg_" + self.state.call_id
            out += self._event("response.output_item.added", {"output_index": self._index, "item": self.d.message_item(self.state, "in_progress")})
            out += self._event("response.content_part.added", {
                "item_id": self._item_id, "output_index": self._index, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})
        return out + self._event("response.output_text.delta", {
            "item_id": self._item_id, "output_index": self._index, "content_index": 0, "delta": delta, "logprobs": []})

    def tool_call(self, call: ToolCall) -> bytes:
        out = self._close()
        self._index += 1
        i = self._index
        added = _tool_item(call, "in_progress")
        done = _tool_item(call)
        out += self._event("response.output_item.added", {"output_index": i, "item": added})
        if call.kind == "custom":
            out += self._event("response.custom_tool_call_input.delta", {"item_id": added["id"], "output_index": i, "delta": call.arguments})
            out += self._event("response.custom_tool_call_input.done", {"item_id": added["id"], "output_index": i, "input": call.arguments})
        else:
            out += self._event("response.function_call_arguments.delta", {"item_id": added["id"], "output_index": i, "delta": call.arguments})
            out += self._event("response.function_call_arguments.done", {"item_id": added["id"], "output_index": i,
                                                                         "name": call.name, "arguments": call.arguments})
        self._output.append(done)
        return out + self._event("response.output_item.done", {"output_index": i, "item": done})

    def end(self) -> bytes:
        out = self._close()
        env = self.d.envelope(self.conv, self.state, "completed", self._output)
        kind = "response.incomplete" if env["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, {"response": env})

    def error(self, err: ProxyError) -> bytes:
        env = self.d.envelope(self.conv, self.state, "failed", self._output)
        env["error"] = {"code": "server_error" if err.status >= 500 else err.kind, "message": err.message}
        return self._event("response.failed", {"response": env})

    def ping(self) -> bytes:
        return SSE_COMMENT_PING
