"""Google Gemini: `POST /v1beta/models/{model}:generateContent` and `:streamGenerateContent?alt=sse`
(Gemini CLI).

No keep-alive comments on this dialect: the @google/genai stream reader matches `^data: ` at the
head of its buffer, so an SSE comment would wedge it. Thought signatures the harness sends are
kept verbatim; we never emit one.
"""

from __future__ import annotations

from typing import Any

import orjson

from tracefleet.proxy.canonical import Conversation, Message, Part, Sampling, Tool, ToolCall
from tracefleet.proxy.errors import ProxyError
from tracefleet.proxy.token_engine import CallState
from tracefleet.proxy.dialects import expect, object_entries, parse_arguments, require_object, type_name, want

_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           405: "INVALID_ARGUMENT", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
           502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
_FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP", "content_filter": "SAFETY"}


def google_error(err: ProxyError) -> dict[str, Any]:
    return {"error": {"code": err.status, "message": err.message, "status": _STATUS.get(err.status, "INTERNAL")}}


def _lower_types(schema: Any) -> Any:
    """Gemini schemas may spell types in upper case (OpenAPI subset); chat templates expect JSON Schema."""
    if isinstance(schema, dict):
        return {k: (v.lower() if k == "type" and isinstance(v, str) else _lower_types(v)) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_lower_types(v) for v in schema]
    return schema


def _result_text(response: Any) -> str:
    if isinstance(response, dict) and len(response) == 1:
        (value,) = response.values()
        if isinstance(value, str):
            return value
    return orjson.dumps(response).decode()


def parse_contents(contents: Any) -> list[Message]:
    expect(isinstance(contents, list), f"invalid type for 'contents': expected array, got {type_name(contents)}", "contents")
    expect(len(contents) > 0, "'contents' must not be empty", "contents")
    out: list[Message] = []
    pending: list[tuple[str, str]] = []  # (call id, name) of model calls not yet answered
    for i, c in enumerate(contents):
        w = f"contents[{i}]"
        expect(isinstance(c, dict), f"invalid type for '{w}': expected object, got {type_name(c)}", w)
        role = c.get("role", "user")
        expect(role in ("user", "model", "function"), f"invalid value for '{w}.role': {role!r} (expected user or model)", w + ".role")
        parts = c.get("parts")
        expect(isinstance(parts, list), f"invalid type for '{w}.parts': expected array, got {type_name(parts)}", w + ".parts")
        msg_parts: list[Part] = []
        results: list[Message] = []
        for j, p in enumerate(parts):
            pw = f"{w}.parts[{j}]"
            expect(isinstance(p, dict), f"invalid type for '{pw}': expected object, got {type_name(p)}", pw)
            if "text" in p:
                expect(isinstance(p["text"], str), f"invalid type for '{pw}.text': expected string", pw + ".text")
                if p.get("thought"):
                    msg_parts.append(Part(type="reasoning", text=p["text"], signature=p.get("thoughtSignature")))
                else:
                    msg_parts.append(Part(type="text", text=p["text"]))
            elif "inlineData" in p:
                d = p["inlineData"] or {}
                mime = d.get("mimeType", "application/octet-stream")
                msg_parts.append(Part(type="image", image_url=f"data:{mime};base64,{d.get('data', '')}", media_type=mime))
            elif "fileData" in p:
                d = p["fileData"] or {}
                msg_parts.append(Part(type="image", image_url=str(d.get("fileUri", "")), media_type=d.get("mimeType")))
            elif "functionCall" in p:
                fc = p["functionCall"]
                expect(isinstance(fc, dict) and isinstance(fc.get("name"), str), f"'{pw}.functionCall' needs a name", pw + ".functionCall")
                cid = fc.get("id") or f"gcall_{i}_{j}"
                pending.append((cid, fc["name"]))
                msg_parts.append(Part(type="tool_call", id=cid, name=fc["name"], arguments=orjson.dumps(fc.get("args") or {}).decode(),
                                      signature=p.get("thoughtSignature")))
            elif "functionResponse" in p:
                fr = p["functionResponse"]
                expect(isinstance(fr, dict) and isinstance(fr.get("name"), str), f"'{pw}.functionResponse' needs a name", pw + ".functionResponse")
                cid = fr.get("id")
                if not cid:
                    match = next((k for k, (_, n) in enumerate(pending) if n == fr["name"]), None)
                    cid = pending[match][0] if match is not None else f"gcall_{fr['name']}"
                pending[:] = [x for x in pending if x[0] != cid]
                results.append(Message(role="tool", parts=[Part(type="tool_result", id=cid, name=fr["name"],
                                                                 text=_result_text(fr.get("response", {})))]))
            elif p.get("thoughtSignature") and len(p) == 1:
                continue
            else:
                raise ProxyError("invalid_request", f"unsupported part at '{pw}': keys {sorted(p)}", param=pw)
        out.extend(results)
        if msg_parts:
            out.append(Message(role="assistant" if role == "model" else "user", parts=msg_parts))
    return out


def parse_tools(tools: Any) -> list[Tool]:
    out = []
    for path, t in object_entries(tools, "tools"):
        for j, fd in enumerate(t.get("functionDeclarations") or t.get("function_declarations") or []):
            p = f"{path}.functionDeclarations[{j}]"
            expect(isinstance(fd, dict) and isinstance(fd.get("name"), str), f"missing required field '{p}.name'", p + ".name")
            params = fd.get("parametersJsonSchema") or _lower_types(fd.get("parameters")) or {"type": "object", "properties": {}}
            out.append(Tool(name=fd["name"], description=fd.get("description"), parameters=params))
    return out


def function_call_part(tc: ToolCall, state: CallState) -> dict[str, Any]:
    args, problem = parse_arguments(tc.arguments)
    if problem:
        state.tool_parse_errors.append(f"{tc.name} ({tc.id}): {problem}")
    return {"functionCall": {"name": tc.name, "args": args, "id": tc.id}}


class Google:
    name = "google"

    def parse(self, body: Any, path_model: str | None = None) -> Conversation:
        body = require_object(body)
        messages = parse_contents(body.get("contents")) if "contents" in body else None
        expect(messages is not None, "missing required field 'contents'", "contents")
        system = body.get("systemInstruction", body.get("system_instruction"))
        if system is not None:
            if isinstance(system, str):
                parts = [Part(type="text", text=system)]
            else:
                expect(isinstance(system, dict) and isinstance(system.get("parts"), list),
                       "invalid 'systemInstruction': expected a Content object with 'parts'", "systemInstruction")
                parts = [Part(type="text", text=str(p.get("text", ""))) for p in system["parts"] if isinstance(p, dict)]
            messages.insert(0, Message(role="system", parts=parts))  # type: ignore[union-attr]
        gen = want(body, "generationConfig", (dict,)) or {}
        cc = gen.get("candidateCount")
        expect(cc in (None, 1), "'generationConfig.candidateCount' > 1 is not supported", "generationConfig.candidateCount")
        fcc = ((want(body, "toolConfig", (dict,)) or {}).get("functionCallingConfig") or {})
        mode = str(fcc.get("mode", "")).upper()
        choice: Any = {"AUTO": "auto", "ANY": "required", "NONE": "none"}.get(mode)
        allowed = fcc.get("allowedFunctionNames") or []
        if mode == "ANY" and len(allowed) == 1:
            choice = {"name": allowed[0]}
        stop = gen.get("stopSequences") or []
        expect(isinstance(stop, list), "invalid type for 'generationConfig.stopSequences': expected array", "generationConfig.stopSequences")
        for key in ("temperature", "topP"):
            v = gen.get(key)
            expect(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
                   f"invalid type for 'generationConfig.{key}': expected number, got {type_name(v)}", f"generationConfig.{key}")
        mot = gen.get("maxOutputTokens")
        expect(mot is None or (isinstance(mot, int) and not isinstance(mot, bool)),
               f"invalid type for 'generationConfig.maxOutputTokens': expected integer, got {type_name(mot)}", "generationConfig.maxOutputTokens")
        return Conversation(
            model=path_model,
            messages=messages,  # type: ignore[arg-type]
            tools=parse_tools(body.get("tools")),
            tool_choice=choice,
            sampling=Sampling(
                max_tokens=mot,
                temperature=gen.get("temperature"),
                top_p=gen.get("topP"),
                top_k=gen.get("topK") if isinstance(gen.get("topK"), int) else None,
                seed=gen.get("seed") if isinstance(gen.get("seed"), int) else None,
                stop=[str(s) for s in stop],
            ),
        )

    def _usage(self, state: CallState) -> dict[str, Any]:
        return {"promptTokenCount": state.prompt_tokens, "candidatesTokenCount": state.completion_tokens,
                "totalTokenCount": state.prompt_tokens + state.completion_tokens}

    def response(self, conv: Conversation, state: CallState) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        if state.reasoning:
            parts.append({"text": state.reasoning_text, "thought": True})
        if state.text:
            parts.append({"text": state.output_text})
        parts.extend(function_call_part(tc, state) for tc in state.tool_calls)
        if not parts:
            parts.append({"text": ""})
        return {
            "candidates": [{"content": {"role": "model", "parts": parts},
                            "finishReason": _FINISH.get(state.finish_reason or "stop", "STOP"), "index": 0}],
            "usageMetadata": self._usage(state),
            "modelVersion": conv.model or state.engine_model,
            "responseId": state.call_id,
        }

    def writer(self, conv: Conversation, state: CallState) -> GoogleStream:
        return GoogleStream(self, conv, state)

    def error_body(self, err: ProxyError) -> dict[str, Any]:
        return google_error(err)


class GoogleStream:
    def __init__(self, dialect: Google, conv: Conversation, state: CallState) -> None:
        self.d = dialect
        self.state = state
        self._tail = {"modelVersion": conv.model or state.engine_model, "responseId": state.call_id}

    def _chunk(self, parts: list[dict[str, Any]], finish: str | None = None, usage: bool = False) -> bytes:
        cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish:
            cand["finishReason"] = finish
        data: dict[str, Any] = {"candidates": [cand]}
        if usage:
            data["usageMetadata"] = self.d._usage(self.state)
        data.update(self._tail)
        return b"data: " + orjson.dumps(data) + b"\r\n\r\n"

    def start(self) -> bytes:
        return b""

    def text(self, delta: str) -> bytes:
        return self._chunk([{"text": delta}])

    def reasoning(self, delta: str) -> bytes:
        return self._chunk([{"text": delta, "thought": True}])

    def tool_call(self, call: ToolCall) -> bytes:
        return self._chunk([function_call_part(call, self.state)])

    def end(self) -> bytes:
        return self._chunk([{"text": ""}], _FINISH.get(self.state.finish_reason or "stop", "STOP"), usage=True)

    def error(self, err: ProxyError) -> bytes:
        return b"data: " + orjson.dumps(google_error(err)) + b"\r\n\r\n"

    def ping(self) -> bytes:
        return b""
