"""The proxy writes capture records with orjson, in two parts (the head while the engine works, the
outcome at the end); readers validate them as `CaptureRecord`. These tests pin that the line the proxy
writes is exactly the record pydantic would build from the same call: every field, no stray keys."""

from __future__ import annotations

import time

import orjson
import pytest

from tracefleet.contract.capture import CallError, CaptureRecord, SpliceInfo, Timings, read_capture_log
from tracefleet.proxy.canonical import ToolCall
from tracefleet.proxy.recording import RecordHead, canonical_dump, encode_record_line
from tracefleet.proxy.dialects.openai_chat import OpenAIChat
from tracefleet.proxy.errors import ProxyError
from tracefleet.proxy.token_engine import CallState

BODY = {
    "model": "m", "max_tokens": 64, "stream": False, "temperature": None,  # nulls in the request stay
    "messages": [{"role": "system", "content": "Réponds en français ✓"},
                 {"role": "user", "content": "read a.txt"},
                 {"role": "assistant", "content": None, "reasoning_content": "look first",
                  "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "read", "arguments": "{\"p\": 1}"}}]},
                 {"role": "tool", "tool_call_id": "c0", "content": "hello"}],
    "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}],
}


def state_for(error: ProxyError | None = None) -> CallState:
    s = CallState(call_id="c1", session_id="s1", dialect="openai-chat", stream=True, received_at=time.time(),
                  policy_version=7, requested_model="m")
    s.engine_model, s.engine_sent_at = "served", s.received_at + 0.001
    s.prompt_ids, s.completion_ids, s.logprobs = [1, 2, 3], [7, 8, 9], [-0.1, -2.5e-7, 0.0]
    s.text.append("Done ")
    s.text.append("now.")
    s.reasoning.append("thinking")
    s.tool_calls = [ToolCall(id="call_1", name="read", arguments='{"path": "a.txt"}'),
                    ToolCall(id="call_2", name="apply", arguments="*** Begin Patch", kind="custom")]
    s.tool_parse_errors = ["<tool_call>{broken"]
    s.finish_reason = "tool_calls"
    s.prompt_tokens, s.completion_tokens = 3, 3
    if error is None:
        s.first_token_at = s.received_at + 0.002
    s.error = error
    s.done_at = s.received_at + 0.01
    return s


def reference(state: CallState, conv, body, headers, splice) -> CaptureRecord:
    """The record as pydantic builds it, field by field from the call's state."""
    err = state.error
    return CaptureRecord(
        call_id=state.call_id, session_id=state.session_id, dialect=state.dialect, mode="exact",
        status="ok" if err is None else "partial", stream=state.stream, requested_model=state.requested_model,
        engine_model=state.engine_model, engine_url="http://engine:8000", policy_version=state.policy_version,
        timings=Timings(received_at=state.received_at, engine_sent_at=state.engine_sent_at,
                        first_token_at=state.first_token_at, done_at=state.done_at),
        request=body, canonical=canonical_dump(conv), headers=headers, prompt_ids=state.prompt_ids,
        completion_ids=state.completion_ids, logprobs=state.logprobs, finish_reason=state.finish_reason,
        output_text=state.output_text, reasoning_text=state.reasoning_text,
        tool_calls=[tc.model_dump() for tc in state.tool_calls], tool_parse_errors=state.tool_parse_errors,
        splice=splice, error=CallError(kind=err.kind, message=err.message, status_code=err.status) if err else None,
        prompt_tokens=state.prompt_tokens, completion_tokens=state.completion_tokens)


@pytest.mark.parametrize("error", [None, ProxyError("engine_disconnect", "engine connection lost mid-call")])
@pytest.mark.parametrize("precomputed", [True, False])
def test_record_line_is_the_pydantic_record(tmp_path, error, precomputed) -> None:
    conv = OpenAIChat().parse(BODY)
    state = state_for(error)
    headers = {"user-agent": "codex/0.169", "session-id": "abc"}
    splice = SpliceInfo(parent_call_id="c0", reused_tokens=120, rendered_tokens=9, matched_messages=3)
    head = RecordHead(state, conv=conv, request=BODY, request_ref=None, headers=headers, mode="exact",
                      engine_url="http://engine:8000")
    if precomputed:
        head.encode()  # what precompute_head does while the engine works
    line = encode_record_line(head, state, splice)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    raw = orjson.loads(line)
    assert set(raw) <= set(CaptureRecord.model_fields), set(raw) - set(CaptureRecord.model_fields)
    assert None not in raw.values() and None not in raw["timings"].values()
    assert raw["request"]["temperature"] is None  # the harness's own nulls are kept verbatim

    path = tmp_path / "s1.jsonl"
    path.write_bytes(line)
    log = read_capture_log(path)
    assert not log.bad_lines and not log.torn_tail
    assert log.records[0].model_dump() == reference(state, conv, BODY, headers, splice).model_dump()
    assert log.records[0].status == ("ok" if error is None else "partial")


def test_record_without_conversation_or_body(tmp_path) -> None:
    """A call refused before parsing, or whose body was spilled to disk, still writes a valid record."""
    state = state_for(ProxyError("engine_5xx", "engine failed (500): boom"))
    state.completion_ids, state.text, state.tool_calls, state.first_token_at = [], [], [], None
    head = RecordHead(state, conv=None, request=None, request_ref="/cap/s1.bodies/c1.json", headers={},
                      mode="server", engine_url="http://e")
    path = tmp_path / "s1.jsonl"
    path.write_bytes(encode_record_line(head, state, None))
    rec = read_capture_log(path).records[0]
    assert rec.status == "error" and rec.error is not None and rec.error.status_code == 502
    assert rec.request is None and rec.canonical is None and rec.request_ref == "/cap/s1.bodies/c1.json"
    assert rec.timings.first_token_at is None and rec.splice is None


def test_request_orjson_cannot_write_still_recorded(tmp_path) -> None:
    """Python's JSON reader accepts integers beyond 64 bits; orjson's writer does not: the record still goes down."""
    body = {**BODY, "seed": 2**70}
    state = state_for()
    head = RecordHead(state, conv=OpenAIChat().parse(BODY), request=body, request_ref=None, headers={},
                      mode="server", engine_url="http://e")
    path = tmp_path / "s1.jsonl"
    path.write_bytes(encode_record_line(head, state, None))
    assert read_capture_log(path).records[0].request["seed"] == 2**70


def test_a_guided_call_is_recorded_guided(tmp_path) -> None:
    """A call the session's guide answered says so (CaptureRecord.guided); the others leave the field out."""
    conv = OpenAIChat().parse(BODY)
    for guided in (True, False):
        state = state_for()
        state.guided = guided
        head = RecordHead(state, conv=conv, request=BODY, request_ref=None, headers={}, mode="exact",
                          engine_url="http://guide:8000")
        line = encode_record_line(head, state, None)
        assert (b'"guided":true' in line) is guided and b'"guided":false' not in line
        path = tmp_path / f"{guided}.jsonl"
        path.write_bytes(line)
        assert read_capture_log(path).records[0].guided is guided
