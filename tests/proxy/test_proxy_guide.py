"""A guided session (tracefleet train --guide): its first calls are answered by the proxy's guide engine, the rest by
the policy's, through one exact-mode splicer, so the policy's prompt holds the guide's turns token for token. The
records say which were guided; the traces make the guide's tokens context. A proxy that cannot guide refuses."""

from __future__ import annotations

from typing import Any

import httpx

from tracefleet.contract.capture import read_capture_log
from tracefleet.traces import SessionInfo, build_traces

SHELL = {"type": "function", "function": {"name": "shell", "description": "run a command",
                                          "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                         "required": ["command"]}}}
GUIDE = {"commands": ["echo guided"], "tool_rounds": 1, "final_text": "The guide is done."}
POLICY = {"commands": ["echo policy"], "tool_rounds": 2, "final_text": "The policy is done."}


def chat(proxy: Any, secret: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    r = httpx.post(proxy.url + "/v1/chat/completions", headers={"authorization": f"Bearer {secret}"}, timeout=60,
                   json={"model": "m", "messages": messages, "tools": [SHELL], "max_tokens": 200})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def run_conversation(proxy: Any, secret: str, turns: int) -> list[dict[str, Any]]:
    """A harness's loop: call, run each tool call (its result is the command back), call again."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Say something in the shell."}]
    answers = []
    for _ in range(turns):
        message = chat(proxy, secret, messages)
        answers.append(message)
        messages.append({k: v for k, v in message.items() if v is not None})
        for call in message.get("tool_calls") or ():
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": call["function"]["arguments"]})
    return answers


def test_the_first_calls_go_to_the_guide_and_are_recorded_guided(make_scripted_engine, start_proxy) -> None:
    guide, policy = make_scripted_engine(GUIDE), make_scripted_engine(POLICY)
    proxy = start_proxy(policy.url, mode="exact", model_path="smollm2", guide_url=guide.url)
    session = proxy.new_session(session_id="g1", guided_calls=1)
    assert session["guided_calls"] == 1
    answers = run_conversation(proxy, session["secret"], 3)
    commands = [a["tool_calls"][0]["function"]["arguments"] if a.get("tool_calls") else a["content"] for a in answers]
    assert "echo guided" in commands[0] and "echo policy" in commands[1], commands
    assert answers[2]["content"] == "The policy is done."

    records = read_capture_log(proxy.capture_dir / "g1.jsonl").records
    assert [r.guided for r in records] == [True, False, False]
    assert [r.engine_url for r in records] == [guide.url, policy.url, policy.url]
    # one splicer for both engines: the policy's prompt is the guide's prompt and sampled ids, then the tool result
    first, second = records[0], records[1]
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == first.prompt_ids + first.completion_ids
    assert second.splice is not None and second.splice.parent_call_id == first.call_id

    [trace] = build_traces(proxy.capture_dir / "g1.jsonl", session=SessionInfo(reward=1.0, group_id="g")).traces
    assert [s.call_id for s in trace.spans] == [r.call_id for r in records[1:]]
    guide_end = len(first.prompt_ids) + len(first.completion_ids)
    assert not trace.loss_mask[:guide_end].any()
    assert int(trace.loss_mask.sum()) == sum(len(r.completion_ids) for r in records[1:])


def test_a_session_without_guided_calls_never_reaches_the_guide(make_scripted_engine, start_proxy) -> None:
    guide, policy = make_scripted_engine(GUIDE), make_scripted_engine(POLICY)
    proxy = start_proxy(policy.url, mode="exact", model_path="smollm2", guide_url=guide.url)
    session = proxy.new_session(session_id="plain")
    run_conversation(proxy, session["secret"], 2)
    records = read_capture_log(proxy.capture_dir / "plain.jsonl").records
    assert [r.guided for r in records] == [False, False] and {r.engine_url for r in records} == {policy.url}


def test_a_proxy_that_cannot_guide_refuses_a_guided_session(make_scripted_engine, start_proxy) -> None:
    policy = make_scripted_engine(POLICY)
    unguided = start_proxy(policy.url, mode="exact", model_path="smollm2")
    r = unguided.admin("POST", "/admin/sessions", {"session_id": "x", "guided_calls": 2})
    assert r.status_code == 400 and "no guide engine" in r.json()["error"]["message"], r.text
    server = start_proxy(policy.url, mode="server", guide_url=policy.url)
    r = server.admin("POST", "/admin/sessions", {"session_id": "y", "guided_calls": 1})
    assert r.status_code == 400 and "exact capture mode" in r.json()["error"]["message"], r.text
    r = server.admin("POST", "/admin/sessions", {"session_id": "z", "guided_calls": -1})
    assert r.status_code == 400, r.text
