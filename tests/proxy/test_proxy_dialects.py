"""Dialect translation on canonical objects: request → canonical → engine messages, and engine
results → each provider's JSON and SSE event sequence. End-to-end wire checks with the real SDKs and
engine live in test_proxy_e2e.py."""

from __future__ import annotations

import time

import orjson
import pytest

from tracefleet.proxy.canonical import ToolCall
from tracefleet.proxy.dialects.anthropic import TRACEFLEET_SIGNATURE, Anthropic
from tracefleet.proxy.dialects.google import Google
from tracefleet.proxy.dialects.openai_chat import OpenAIChat
from tracefleet.proxy.dialects.openai_responses import OpenAIResponses, decode_reasoning, encode_reasoning
from tracefleet.proxy.errors import ProxyError
from tracefleet.proxy.token_engine import CallState, engine_messages, engine_tools


def sse_events(raw: bytes) -> list[tuple[str | None, dict | str]]:
    out = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not block.strip() or block.startswith(b":"):
            continue
        event, data = None, None
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                event = line[7:].decode()
            elif line.startswith(b"data: "):
                data = line[6:]
        out.append((event, data.decode() if data == b"[DONE]" else orjson.loads(data)))
    return out


def finished_state(dialect: str, *, text: str = "Done.", reasoning: str = "", calls: list[ToolCall] | None = None) -> CallState:
    s = CallState(call_id="c1", session_id="s1", dialect=dialect, stream=True, received_at=time.time())
    s.prompt_ids, s.completion_ids, s.logprobs = [1, 2, 3], [7, 8], [-0.1, -0.2]
    s.prompt_tokens, s.completion_tokens = 3, 2
    if text:
        s.text.append(text)
    if reasoning:
        s.reasoning.append(reasoning)
    s.tool_calls = list(calls or [])
    s.finish_reason = "tool_calls" if calls else "stop"
    return s


CALL = ToolCall(id="call_1", name="read_file", arguments='{"path": "a.txt"}')


def render_stream(writer, state: CallState) -> bytes:
    out = writer.start()
    for r in state.reasoning:
        out += writer.reasoning(r)
    for t in state.text:
        out += writer.text(t)
    for c in state.tool_calls:
        out += writer.tool_call(c)
    return out + writer.end()


# -- OpenAI Chat ---------------------------------------------------------------------------------

def test_chat_request_to_canonical_and_engine_messages():
    conv = OpenAIChat().parse({
        "model": "qwen", "stream": True, "max_tokens": 50, "stop": "END", "temperature": 0,
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]},
            {"role": "assistant", "content": None, "reasoning_content": "hmm",
             "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "file body"}]},
        ],
        "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}],
    })
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool"]
    assert conv.sampling.stop == ["END"] and conv.sampling.max_tokens == 50 and conv.stream
    assert conv.messages[1].parts[1].type == "image"
    msgs = engine_messages(conv)
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == '{"path":"a"}'  # verbatim, not re-serialised
    assert msgs[2]["reasoning_content"] == "hmm"
    assert msgs[3] == {"role": "tool", "tool_call_id": "call_1", "content": "file body"}
    assert msgs[1]["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    assert engine_tools(conv)[0]["function"]["name"] == "read_file"


@pytest.mark.parametrize("body, needle", [
    ({"model": "m"}, "messages"),
    ({"model": "m", "messages": "hi"}, "'messages': expected array"),
    ({"model": "m", "messages": []}, "at least one"),
    ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "'temperature'"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 3}, "'n'"),
    ({"model": 5, "messages": [{"role": "user", "content": "x"}]}, "'model'"),
])
def test_chat_rejects_bad_requests_naming_the_field(body, needle):
    with pytest.raises(ProxyError) as exc:
        OpenAIChat().parse(body)
    assert exc.value.status == 400 and needle in exc.value.message


def test_chat_renders_response_and_stream():
    d = OpenAIChat()
    conv = d.parse({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True,
                    "stream_options": {"include_usage": True}})
    st = finished_state("openai-chat", calls=[CALL])
    resp = d.response(conv, st)
    assert resp["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == CALL.arguments
    assert resp["choices"][0]["finish_reason"] == "tool_calls" and resp["usage"]["total_tokens"] == 5
    events = sse_events(render_stream(d.writer(conv, st), st))
    assert events[0][1]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1][1] == "[DONE]"
    assert events[-2][1]["usage"]["completion_tokens"] == 2 and events[-2][1]["choices"] == []
    assert events[-3][1]["choices"][0]["finish_reason"] == "tool_calls"
    assert "".join(e[1]["choices"][0]["delta"].get("content") or "" for e in events[:-2]) == "Done."


# -- OpenAI Responses ----------------------------------------------------------------------------

def test_responses_request_round_trips_reasoning_and_tool_items():
    blob = encode_reasoning("I should read the file")
    assert decode_reasoning(blob) == "I should read the file" and decode_reasoning("gAAAA-openai-blob") is None
    conv = OpenAIResponses().parse({
        "model": "gpt-5", "instructions": "sys", "store": False, "include": ["reasoning.encrypted_content"],
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": blob},
            {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{\"cmd\":[\"ls\"]}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
            {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "foreign"}], "encrypted_content": "gAAAA"},
            {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "custom_tool_call_output", "call_id": "call_2", "output": "ok"},
        ],
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}},
                  {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
                  {"type": "web_search"}],
    })
    roles = [m.role for m in conv.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assistant = conv.messages[2]
    assert assistant.parts[0].type == "reasoning" and assistant.parts[0].text == "I should read the file"
    assert assistant.parts[1].arguments == '{"cmd":["ls"]}'
    assert conv.messages[4].parts[0].signature == "gAAAA" and conv.messages[4].parts[0].text == "foreign"
    assert [t.kind for t in conv.tools] == ["function", "custom"]  # hosted web_search dropped
    msgs = engine_messages(conv)
    assert orjson.loads(msgs[4]["tool_calls"][0]["function"]["arguments"]) == {"input": "*** Begin Patch"}
    with pytest.raises(ProxyError, match="previous_response_id"):
        OpenAIResponses().parse({"model": "m", "input": "x", "previous_response_id": "resp_1"})


def test_responses_stream_event_sequence():
    d = OpenAIResponses()
    conv = d.parse({"model": "gpt-5", "input": "go", "stream": True, "include": ["reasoning.encrypted_content"]})
    st = finished_state("openai-responses", reasoning="think", calls=[CALL])
    events = sse_events(render_stream(d.writer(conv, st), st))
    types = [e for e, _ in events]
    assert types == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed",
    ]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert all(data["type"] == e for e, data in events)
    final = events[-1][1]["response"]
    assert [o["type"] for o in final["output"]] == ["reasoning", "message", "function_call"]
    assert decode_reasoning(final["output"][0]["encrypted_content"]) == "think"
    assert final["output"][2]["call_id"] == "call_1" and final["usage"]["output_tokens"] == 2
    assert d.response(conv, st)["output"] == final["output"]


# -- Anthropic -----------------------------------------------------------------------------------

def test_anthropic_request_system_inside_messages_thinking_and_tool_results():
    conv = Anthropic().parse({
        "model": "claude-sonnet", "max_tokens": 100,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "fix it"},
            {"role": "system", "content": "reminder"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "plan", "signature": "EqQBCkYI-anthropic"},
                {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "body"}],
                 "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "continue"}]},
        ],
        "tools": [{"name": "Read", "input_schema": {"type": "object"}}, {"type": "web_search_20250305", "name": "web_search"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    })
    assert [m.role for m in conv.messages] == ["system", "user", "system", "assistant", "tool", "user"]
    thinking = conv.messages[3].parts[0]
    assert thinking.type == "reasoning" and thinking.signature == "EqQBCkYI-anthropic"
    assert conv.messages[4].parts[0].text == "body" and conv.messages[5].text() == "continue"
    assert [t.name for t in conv.tools] == ["Read"]
    with pytest.raises(ProxyError, match="max_tokens"):
        Anthropic().parse({"model": "c", "messages": [{"role": "user", "content": "x"}]})
    assert Anthropic().parse({"model": "c", "messages": [{"role": "user", "content": "x"}]}, count_only=True)


def test_anthropic_stream_event_sequence_and_signature():
    d = Anthropic()
    conv = d.parse({"model": "claude", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}], "stream": True})
    st = finished_state("anthropic", reasoning="think", calls=[CALL])
    events = sse_events(render_stream(d.writer(conv, st), st))
    types = [e for e, _ in events]
    assert types[:2] == ["message_start", "ping"]
    assert types[-2:] == ["message_delta", "message_stop"]
    blocks = [data["content_block"]["type"] for e, data in events if e == "content_block_start"]
    assert blocks == ["thinking", "text", "tool_use"]
    assert types.count("content_block_start") == types.count("content_block_stop") == 3
    sig = [data["delta"]["signature"] for e, data in events if e == "content_block_delta" and data["delta"]["type"] == "signature_delta"]
    assert sig == [TRACEFLEET_SIGNATURE]  # ours, plainly labelled; never a fake Anthropic signature
    tool_json = [data["delta"]["partial_json"] for e, data in events if e == "content_block_delta" and data["delta"]["type"] == "input_json_delta"]
    assert orjson.loads("".join(tool_json)) == {"path": "a.txt"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    body = d.response(conv, st)
    assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use"] and body["stop_reason"] == "tool_use"


# -- Google --------------------------------------------------------------------------------------

def test_google_request_pairs_function_responses_with_calls():
    conv = Google().parse({
        "systemInstruction": {"parts": [{"text": "sys"}]},
        "contents": [
            {"role": "user", "parts": [{"text": "list files"}]},
            {"role": "model", "parts": [{"text": "plan", "thought": True},
                                        {"functionCall": {"name": "ls", "args": {"dir": "."}}, "thoughtSignature": "skip_thought_signature_validator"}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {"output": "a.txt"}}}]},
        ],
        "tools": [{"functionDeclarations": [{"name": "ls", "parameters": {"type": "OBJECT", "properties": {"dir": {"type": "STRING"}}}}]}],
        "generationConfig": {"temperature": 0.2, "maxOutputTokens": 64},
    }, path_model="gemini-2.5-pro")
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool"]
    call = conv.messages[2].parts[1]
    assert conv.messages[3].parts[0].id == call.id and conv.messages[3].parts[0].text == "a.txt"
    assert call.signature == "skip_thought_signature_validator"
    assert conv.tools[0].parameters == {"type": "object", "properties": {"dir": {"type": "string"}}}
    assert conv.model == "gemini-2.5-pro" and conv.sampling.max_tokens == 64


def test_google_renders_function_calls_and_stream_chunks():
    d = Google()
    conv = d.parse({"contents": [{"role": "user", "parts": [{"text": "x"}]}]}, path_model="gemini")
    st = finished_state("google", calls=[CALL])
    body = d.response(conv, st)
    parts = body["candidates"][0]["content"]["parts"]
    assert parts[0] == {"text": "Done."} and parts[1]["functionCall"] == {"name": "read_file", "args": {"path": "a.txt"}, "id": "call_1"}
    assert body["usageMetadata"]["totalTokenCount"] == 5
    raw = render_stream(d.writer(conv, st), st)
    assert b": " not in raw.split(b"data: ")[0]  # no SSE comments: the genai reader cannot skip them
    events = sse_events(raw)
    assert events[-1][1]["candidates"][0]["finishReason"] == "STOP" and "usageMetadata" in events[-1][1]


def test_unparseable_tool_arguments_are_flagged_not_dropped():
    d = Anthropic()
    conv = d.parse({"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    st = finished_state("anthropic", calls=[ToolCall(id="call_9", name="Bash", arguments="{not json")])
    body = d.response(conv, st)
    assert body["content"][-1]["type"] == "tool_use" and st.tool_parse_errors and "call_9" in st.tool_parse_errors[0]
