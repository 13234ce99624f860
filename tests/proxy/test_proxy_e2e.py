"""The proxy end to end: official SDKs (openai, anthropic) and raw HTTP (Google) → proxy → the real
engine server (scripted backend: real SmolLM2 tokenizer and chat template, tool call then text).

Every dialect, streamed and not, runs a full two-round tool loop; the capture log must hold every
call with the engine's own token ids and logprobs (checked against a direct engine call)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from tracefleet.contract.capture import read_capture_log
from tracefleet.proxy.canonical import Conversation
from tracefleet.proxy.token_engine import engine_messages, engine_tools

SHELL_SCHEMA = {"type": "object", "properties": {"command": {"type": "string", "description": "shell command"}},
                "required": ["command"]}
PROMPT = "Write a note and list the directory."


# -- one tool loop per dialect: returns (final text, [tool calls made], usage of the last call) ------

def run_chat(base: str, key: str, stream: bool) -> tuple[str, list[dict[str, Any]], dict[str, int]]:
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    tools = [{"type": "function", "function": {"name": "shell", "description": "Run a shell command", "parameters": SHELL_SCHEMA}}]
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": PROMPT}]
    calls: list[dict[str, Any]] = []
    for _ in range(5):
        if stream:
            text, tcs, usage, finish = "", {}, None, None
            for chunk in client.chat.completions.create(model="qwen-test", messages=msgs, tools=tools, stream=True,
                                                        stream_options={"include_usage": True}):
                if chunk.usage:
                    usage = chunk.usage
                for ch in chunk.choices:
                    text += ch.delta.content or ""
                    finish = ch.finish_reason or finish
                    for tc in ch.delta.tool_calls or []:
                        slot = tcs.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                        slot["id"] = tc.id or slot["id"]
                        slot["name"] += tc.function.name or ""
                        slot["arguments"] += tc.function.arguments or ""
            tool_calls = [tcs[i] for i in sorted(tcs)]
        else:
            r = client.chat.completions.create(model="qwen-test", messages=msgs, tools=tools)
            text, usage, finish = r.choices[0].message.content or "", r.usage, r.choices[0].finish_reason
            tool_calls = [{"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
                          for t in r.choices[0].message.tool_calls or []]
        u = {"prompt": usage.prompt_tokens, "completion": usage.completion_tokens}
        if not tool_calls:
            assert finish == "stop"
            return text, calls, u
        assert finish == "tool_calls"
        calls.extend(tool_calls)
        msgs.append({"role": "assistant", "content": text or None, "tool_calls": [
            {"id": t["id"], "type": "function", "function": {"name": t["name"], "arguments": t["arguments"]}} for t in tool_calls]})
        msgs.extend({"role": "tool", "tool_call_id": t["id"], "content": f"ran: {json.loads(t['arguments'])['command']}"}
                    for t in tool_calls)
    raise AssertionError("no final answer after 5 rounds")


def run_responses(base: str, key: str, stream: bool) -> tuple[str, list[dict[str, Any]], dict[str, int]]:
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    tools = [{"type": "function", "name": "shell", "description": "Run a shell command", "parameters": SHELL_SCHEMA, "strict": False}]
    items: list[Any] = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]}]
    calls: list[dict[str, Any]] = []
    for _ in range(5):
        kwargs = dict(model="gpt-test", instructions="You are a coding agent.", input=items, tools=tools, store=False,
                      include=["reasoning.encrypted_content"])
        if stream:
            with client.responses.stream(**kwargs) as s:
                seen = [ev.type for ev in s]
                resp = s.get_final_response()
            assert seen[:2] == ["response.created", "response.in_progress"] and seen[-1] == "response.completed"
        else:
            resp = client.responses.create(**kwargs)
        assert resp.status == "completed"
        fcs = [o for o in resp.output if o.type == "function_call"]
        u = {"prompt": resp.usage.input_tokens, "completion": resp.usage.output_tokens}
        if not fcs:
            return resp.output_text, calls, u
        calls.extend({"id": f.call_id, "name": f.name, "arguments": f.arguments} for f in fcs)
        items.extend(o.model_dump(exclude_none=True) for o in resp.output)  # as Codex does: echo output items
        items.extend({"type": "function_call_output", "call_id": f.call_id, "output": f"ran: {json.loads(f.arguments)['command']}"}
                     for f in fcs)
    raise AssertionError("no final answer after 5 rounds")


def run_anthropic(base: str, key: str, stream: bool) -> tuple[str, list[dict[str, Any]], dict[str, int]]:
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    tools = [{"name": "shell", "description": "Run a shell command", "input_schema": SHELL_SCHEMA}]
    msgs: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}}]}]
    calls: list[dict[str, Any]] = []
    for _ in range(5):
        kwargs = dict(model="claude-test", max_tokens=512, system=[{"type": "text", "text": "You are Claude Code."}],
                      messages=msgs, tools=tools)
        if stream:
            with client.messages.stream(**kwargs) as s:
                msg = s.get_final_message()
        else:
            msg = client.messages.create(**kwargs)
        uses = [b for b in msg.content if b.type == "tool_use"]
        u = {"prompt": msg.usage.input_tokens, "completion": msg.usage.output_tokens}
        if not uses:
            assert msg.stop_reason == "end_turn"
            return "".join(b.text for b in msg.content if b.type == "text"), calls, u
        assert msg.stop_reason == "tool_use"
        calls.extend({"id": b.id, "name": b.name, "arguments": json.dumps(b.input)} for b in uses)
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id,
                                                   "content": f"ran: {b.input['command']}"} for b in uses]})
    raise AssertionError("no final answer after 5 rounds")


def run_google(base: str, key: str, stream: bool) -> tuple[str, list[dict[str, Any]], dict[str, int]]:
    tools = [{"functionDeclarations": [{"name": "shell", "description": "Run a shell command", "parametersJsonSchema": SHELL_SCHEMA}]}]
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": PROMPT}]}]
    calls: list[dict[str, Any]] = []
    for _ in range(5):
        body = {"contents": contents, "tools": tools, "systemInstruction": {"parts": [{"text": "You are Gemini CLI."}]},
                "generationConfig": {"temperature": 0}}
        if stream:
            r = httpx.post(base + "/v1beta/models/gemini-test:streamGenerateContent?alt=sse", json=body,
                           headers={"x-goog-api-key": key}, timeout=60)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            chunks = [orjson.loads(line[6:]) for line in r.text.split("\r\n") if line.startswith("data: ")]
            parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
            last = chunks[-1]
        else:
            r = httpx.post(base + "/v1beta/models/gemini-test:generateContent", json=body, headers={"x-goog-api-key": key}, timeout=60)
            assert r.status_code == 200, r.text
            last = r.json()
            parts = last["candidates"][0]["content"]["parts"]
        assert last["candidates"][0]["finishReason"] == "STOP"
        u = {"prompt": last["usageMetadata"]["promptTokenCount"], "completion": last["usageMetadata"]["candidatesTokenCount"]}
        fcs = [p["functionCall"] for p in parts if "functionCall" in p]
        if not fcs:
            return "".join(p.get("text", "") for p in parts), calls, u
        calls.extend({"id": f.get("id"), "name": f["name"], "arguments": json.dumps(f["args"])} for f in fcs)
        # Gemini CLI's habit: model turn echoed without ids, a placeholder thoughtSignature on calls
        contents.append({"role": "model", "parts": [{"functionCall": {"name": f["name"], "args": f["args"]},
                                                     "thoughtSignature": "skip_thought_signature_validator"} for f in fcs]})
        contents.append({"role": "user", "parts": [{"functionResponse": {"name": f["name"], "response": {"output": f"ran: {f['args']['command']}"}}}
                                                   for f in fcs]})
    raise AssertionError("no final answer after 5 rounds")


RUNNERS = {"openai-chat": run_chat, "openai-responses": run_responses, "anthropic": run_anthropic, "google": run_google}


def direct_engine(engine_url: str, canonical: dict[str, Any]) -> dict[str, Any]:
    """What the engine itself answers for the conversation the proxy recorded."""
    conv = Conversation.model_validate(canonical)
    body: dict[str, Any] = {"model": "smollm2", "messages": engine_messages(conv), "return_token_ids": True, "logprobs": True}
    if conv.tools:
        body["tools"] = engine_tools(conv)
    r = httpx.post(engine_url + "/v1/chat/completions", json=body, timeout=60)
    r.raise_for_status()
    return r.json()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("dialect", list(RUNNERS))
def test_tool_loop_through_every_dialect(scripted_engine, start_proxy, dialect, stream):
    proxy = start_proxy(scripted_engine.url)
    session = proxy.new_session(metadata={"test": dialect})
    # the /s/<id> prefix form for half the cases, the plain root for the others
    base = proxy.url + (session["base_path"] if stream else "")
    text, calls, usage = RUNNERS[dialect](base, session["secret"], stream)

    script = scripted_engine.script()
    assert text == script["final_text"]
    assert len(calls) == 2 and all(c["name"] == "shell" for c in calls)
    assert [json.loads(c["arguments"])["command"] for c in calls] == script["commands"][:2]

    log = read_capture_log(proxy.capture_dir / f"{session['session_id']}.jsonl")
    assert not log.torn_tail and not log.bad_lines
    recs = log.records
    assert len(recs) == 3
    for i, rec in enumerate(recs):
        assert rec.status == "ok" and rec.dialect == dialect and rec.stream == stream and rec.error is None
        assert rec.engine_model == "smollm2" and rec.policy_version == 0 and rec.mode == "server"
        assert rec.prompt_ids and rec.completion_ids and len(rec.logprobs) == len(rec.completion_ids)
        assert rec.request is not None and rec.canonical is not None
        t = rec.timings
        assert t.received_at <= t.engine_sent_at <= t.first_token_at <= t.done_at
        # the engine's own answer to the same conversation: same prompt ids, sampled ids, logprobs
        direct = direct_engine(scripted_engine.url, rec.canonical)
        assert rec.prompt_ids == direct["prompt_token_ids"]
        assert rec.completion_ids == direct["choices"][0]["token_ids"]
        assert rec.logprobs == [c["logprob"] for c in direct["choices"][0]["logprobs"]["content"]]
        assert rec.finish_reason == ("tool_calls" if i < 2 else "stop")
        assert len(rec.tool_calls) == (1 if i < 2 else 0) and not rec.tool_parse_errors
    # later prompts extend earlier ones in server mode with this template (no drift for this history)
    assert recs[1].prompt_ids[: len(recs[0].prompt_ids)] == recs[0].prompt_ids
    assert usage == {"prompt": len(recs[-1].prompt_ids), "completion": len(recs[-1].completion_ids)}
    info = proxy.admin("GET", f"/admin/sessions/{session['session_id']}").json()
    assert info["calls"] == 3 and info["errors"] == 0 and info["active"] is True


def test_stream_forwards_deltas_as_the_engine_produces_them(make_scripted_engine, start_proxy):
    """Real streaming: with a slow engine, the first text reaches the client long before the last."""
    engine = make_scripted_engine({"token_delay_s": 0.05, "no_tools_text": "one two three four five six seven eight nine ten"})
    proxy = start_proxy(engine.url)
    s = proxy.new_session()
    import time

    arrivals = []
    t0 = time.monotonic()
    with httpx.stream("POST", proxy.url + "/v1/messages", headers={"x-api-key": s["secret"]}, timeout=60,
                      json={"model": "c", "max_tokens": 100, "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
        for line in r.iter_lines():
            if '"text_delta"' in line:
                arrivals.append(time.monotonic() - t0)
    assert len(arrivals) >= 8
    assert arrivals[-1] - arrivals[0] > 0.3  # spread over the generation, not one burst at the end


def test_keepalive_pings_during_engine_silence(make_scripted_engine, start_proxy):
    engine = make_scripted_engine({"first_token_delay_s": 1.5})
    proxy = start_proxy(engine.url, keepalive_s=0.3)
    s = proxy.new_session()
    client = anthropic.Anthropic(base_url=proxy.url, api_key=s["secret"], max_retries=0)
    with client.messages.stream(model="c", max_tokens=50, messages=[{"role": "user", "content": "hi"}]) as st:
        final = st.get_final_message()  # the SDK accepts the pings (and hides them)
    assert final.content[0].text == engine.script()["no_tools_text"]
    with httpx.stream("POST", proxy.url + "/v1/messages", headers={"x-api-key": s["secret"]}, timeout=60,
                      json={"model": "c", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
        kinds = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
    first_block = kinds.index("content_block_start")
    assert kinds[0] == "message_start" and kinds[:first_block].count("ping") >= 3 and kinds[-1] == "message_stop"
    # OpenAI dialects use SSE comments, which SDKs skip
    oc = openai.OpenAI(base_url=proxy.url + "/v1", api_key=s["secret"], max_retries=0)
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                      json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}, timeout=60) as r:
        raw = r.read()
    assert b": ping\n\n" in raw and raw.endswith(b"data: [DONE]\n\n")
    text = "".join(c.choices[0].delta.content or "" for c in oc.chat.completions.create(
        model="m", stream=True, messages=[{"role": "user", "content": "hi"}]) if c.choices)
    assert text == engine.script()["no_tools_text"]


def test_count_tokens_is_the_engines_real_count(scripted_engine, start_proxy):
    proxy = start_proxy(scripted_engine.url)
    s = proxy.new_session()
    client = anthropic.Anthropic(base_url=proxy.url, api_key=s["secret"], max_retries=0)
    tools = [{"name": "shell", "description": "Run", "input_schema": SHELL_SCHEMA}]
    msgs = [{"role": "user", "content": "count me, please"}]
    counted = client.messages.count_tokens(model="c", system="sys", messages=msgs, tools=tools).input_tokens
    # the engine's prompt for the same conversation (what a generation call actually prefills)
    created = client.messages.create(model="c", max_tokens=512, system="sys", messages=msgs, tools=tools)
    assert counted == created.usage.input_tokens > 50
    g = httpx.post(proxy.url + "/v1beta/models/g:countTokens", headers={"x-goog-api-key": s["secret"]},
                   json={"contents": [{"role": "user", "parts": [{"text": "count me, please"}]}]}).json()
    assert g["totalTokens"] > 3


def test_probes_and_models(scripted_engine, start_proxy):
    proxy = start_proxy(scripted_engine.url)
    s = proxy.new_session()
    assert httpx.head(proxy.url + "/").status_code == 200
    assert httpx.get(proxy.url + "/").json()["status"] == "ok"
    oc = openai.OpenAI(base_url=proxy.url + "/v1", api_key=s["secret"], max_retries=0)
    assert [m.id for m in oc.models.list()] == ["smollm2"]
    ac = anthropic.Anthropic(base_url=proxy.url, api_key=s["secret"], max_retries=0)
    assert [m.id for m in ac.models.list()] == ["smollm2"]
    g = httpx.get(proxy.url + "/v1beta/models", headers={"x-goog-api-key": s["secret"]}).json()
    assert g["models"][0]["name"] == "models/smollm2"
    assert httpx.get(proxy.url + "/v1/models").status_code == 401


def test_large_body_is_spilled_to_disk_not_inlined(scripted_engine, start_proxy):
    proxy = start_proxy(scripted_engine.url, inline_body_bytes=2048)
    s = proxy.new_session()
    big = "x " * 3000
    r = httpx.post(proxy.url + "/v1/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                   json={"model": "m", "messages": [{"role": "user", "content": big}]}, timeout=60)
    assert r.status_code == 200, r.text
    rec = read_capture_log(proxy.capture_dir / f"{s['session_id']}.jsonl").records[0]
    assert rec.request is None and rec.request_ref
    assert orjson.loads(open(rec.request_ref, "rb").read())["messages"][0]["content"] == big
    assert rec.prompt_ids and rec.completion_ids
