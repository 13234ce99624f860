"""Exact mode through the real proxy app, per dialect: a scripted 10-turn tool-using conversation.

Every dialect's harness-shaped client echoes the history back in its own wire format (with the usual
mutations: compact re-serialised arguments, moved cache markers, block lists vs strings, echoed
reasoning). The capture log must show one exact chain: each prompt = previous prompt + previous sampled
ids + new tokens, and the recorded logprobs equal a re-score of the exact sequence.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tracefleet.capture import read_capture_log
from tracefleet.formats.families import load_model_format
from tracefleet.proxy.app import create_app
from tracefleet.proxy.config import PresetSession, ProxyConfig
from tracefleet.proxy.engine_client import EngineClient
from tracefleet.proxy.exact.engine import ExactTokenEngine
from tracefleet.proxy.exact.metrics import register_exact_metrics

from fixtures.servers import serving

TURNS = 10
SECRET = "exact-secret"
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


def _sse_data(r: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]


class ChatClient:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                               {"role": "user", "content": [{"type": "text", "text": "Write a note."}]}]

    def send(self, http: httpx.Client, turn: int) -> list[tuple[str, str, str]]:
        body = {"model": "smollm2", "messages": self.messages, "stream": True, "tools": [
            {"type": "function", "function": {"name": "bash", "parameters": SCHEMA}}]}
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200, r.read()
            chunks = _sse_data(r)
        text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c.get("choices"))
        calls = [tc for c in chunks if c.get("choices") for tc in c["choices"][0]["delta"].get("tool_calls") or ()]
        out = [(tc["id"], tc["function"]["name"], tc["function"]["arguments"]) for tc in calls]
        self.messages.append({"role": "assistant", "content": text or None, "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(json.loads(a), separators=(",", ":"))}}
            for i, n, a in out] or None})
        for i, _, _ in out:
            self.messages.append({"role": "tool", "tool_call_id": i, "content": f"result {turn}"})
        return out


class ResponsesClient:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = [{"type": "message", "role": "developer", "content": "You are a coding agent."},
                                            {"type": "message", "role": "user",
                                             "content": [{"type": "input_text", "text": "Write a note."}]}]

    def send(self, http: httpx.Client, turn: int) -> list[tuple[str, str, str]]:
        body = {"model": "smollm2", "input": self.items, "stream": False,
                "tools": [{"type": "function", "name": "shell", "parameters": SCHEMA}]}
        r = http.post("/v1/responses", json=body)
        assert r.status_code == 200, r.text
        out = []
        for item in r.json()["output"]:
            if item["type"] == "function_call":
                out.append((item["call_id"], item["name"], item["arguments"]))
                self.items.append({"type": "function_call", "call_id": item["call_id"], "name": item["name"],
                                   "arguments": json.dumps(json.loads(item["arguments"]), indent=1)})
            elif item["type"] == "message":
                self.items.append({"type": "message", "role": "assistant", "content": item["content"]})
            elif item["type"] == "reasoning":
                self.items.append(item)  # reasoning echoed back
        for i, _, _ in out:
            self.items.append({"type": "function_call_output", "call_id": i, "output": f"result {turn}"})
        return out


class AnthropicClient:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "Write a note."}]

    def send(self, http: httpx.Client, turn: int) -> list[tuple[str, str, str]]:
        # Claude Code moves its cache marker to the newest block each turn
        msgs = json.loads(json.dumps(self.messages))
        last = msgs[-1]["content"]
        if isinstance(last, list):
            last[-1]["cache_control"] = {"type": "ephemeral"}
        body = {"model": "smollm2", "max_tokens": 256, "messages": msgs, "stream": False,
                "system": [{"type": "text", "text": "You are a coding agent."}],
                "tools": [{"name": "Bash", "input_schema": SCHEMA}]}
        r = http.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
        assert r.status_code == 200, r.text
        content = r.json()["content"]
        self.messages.append({"role": "assistant", "content": content})
        out = [(b["id"], b["name"], json.dumps(b["input"])) for b in content if b["type"] == "tool_use"]
        if out:
            self.messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": i, "content": [{"type": "text", "text": f"result {turn}"}]}
                for i, _, _ in out]})
        return out


class GoogleClient:
    def __init__(self) -> None:
        self.contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": "Write a note."}]}]

    def send(self, http: httpx.Client, turn: int) -> list[tuple[str, str, str]]:
        body = {"contents": self.contents, "systemInstruction": {"parts": [{"text": "You are a coding agent."}]},
                "tools": [{"functionDeclarations": [{"name": "run_shell_command", "parameters": SCHEMA}]}]}
        r = http.post("/v1beta/models/smollm2:generateContent", json=body)
        assert r.status_code == 200, r.text
        parts = r.json()["candidates"][0]["content"]["parts"]
        self.contents.append({"role": "model", "parts": parts})
        out = [(p["functionCall"].get("id", ""), p["functionCall"]["name"], json.dumps(p["functionCall"]["args"]))
               for p in parts if "functionCall" in p]
        if out:
            self.contents.append({"role": "user", "parts": [
                {"functionResponse": {"name": n, "response": {"output": f"result {turn}"}}} for _, n, _ in out]})
        return out


CLIENTS = {"openai-chat": ChatClient, "openai-responses": ResponsesClient, "anthropic": AnthropicClient,
           "google": GoogleClient}


def converse(app: Any, dialect: str) -> tuple[list[list[tuple[str, str, str]]], str]:
    """TURNS turns of `dialect`'s client against `app` (served on a free port); the tool calls each turn got,
    and the proxy's /metrics text at the end."""
    client = CLIENTS[dialect]()
    with serving(app) as proxy, httpx.Client(base_url=proxy.url, timeout=60, headers={
            "authorization": f"Bearer {SECRET}", "x-goog-api-key": SECRET}) as http:
        calls = [client.send(http, turn) for turn in range(TURNS)]
        return calls, http.get("/metrics").text


@pytest.fixture(scope="module")
def smollm2_format():
    return load_model_format("smollm2")


@pytest.mark.parametrize("dialect", list(CLIENTS))
def test_ten_turn_tool_conversation_is_one_exact_chain(dialect, scripted_engine, smollm2_format, tmp_path: Path):
    scripted_engine.configure(tool_rounds=TURNS - 1)
    config = ProxyConfig(engine_url=scripted_engine.url, capture_dir=tmp_path, admin_token="admin", mode="exact",
                         sessions=[PresetSession(session_id="s1", secret=SECRET)])
    engine = ExactTokenEngine(EngineClient(scripted_engine.url), smollm2_format)
    app = create_app(config, token_engine=engine)
    register_exact_metrics(app.state.proxy.metrics.registry, engine)
    calls, metrics = converse(app, dialect)
    assert [len(c) for c in calls] == [1] * (TURNS - 1) + [0], calls
    log = read_capture_log(tmp_path / "s1.jsonl")
    recs = log.records
    assert len(recs) == TURNS and not log.torn_tail
    assert all(r.mode == "exact" and r.status == "ok" and not r.tool_parse_errors for r in recs)
    for prev, cur in zip(recs, recs[1:]):
        served = prev.prompt_ids + prev.completion_ids
        assert cur.prompt_ids[:len(served)] == served, (dialect, cur.call_id)
    # sampled logprobs = a re-score of the whole exact sequence (scripted logprobs depend on position and id)
    seq = recs[-1].prompt_ids + recs[-1].completion_ids
    r = httpx.post(scripted_engine.url + "/v1/completions",
                   json={"prompt": seq, "max_tokens": 0, "prompt_logprobs": 0}, timeout=60)
    pls = r.json()["choices"][0]["prompt_logprobs"]
    for rec in recs[:-1]:
        start = len(rec.prompt_ids)
        assert rec.logprobs == [pls[start + i][str(t)]["logprob"] for i, t in enumerate(rec.completion_ids)]
    s = engine.stats
    assert s["spliced"] == TURNS - 1 and s["new_roots"] == 1 and s["parse_failures"] == 0
    total = sum(len(r.prompt_ids) for r in recs)
    assert f'tracefleet_proxy_exact_calls_total{{kind="spliced"}} {TURNS - 1}.0' in metrics
    assert 'tracefleet_proxy_exact_new_roots_total{reason="new_conversation"} 1.0' in metrics
    ratio = float(metrics.split("\ntracefleet_proxy_exact_splice_hit_ratio ")[1].split()[0])
    assert ratio == s["reused_tokens"] / total > 0.8
    print(f"\n{dialect}: {TURNS} calls, {total} prompt tokens, {s['rendered_tokens']} rendered fresh, "
          f"{s['drift_avoided']} calls where a re-render would have drifted")


# -- wiring: `ProxyConfig(mode="exact")` alone selects the exact engine ----------------------------
@pytest.mark.parametrize("dialect", list(CLIENTS))
def test_config_selects_exact_mode_and_records_splices(dialect, scripted_engine, tmp_path: Path):
    scripted_engine.configure(tool_rounds=TURNS - 1)
    config = ProxyConfig(engine_url=scripted_engine.url, capture_dir=tmp_path, admin_token="admin", mode="exact",
                         model_path="smollm2", sessions=[PresetSession(session_id="s1", secret=SECRET)])
    app = create_app(config)
    assert app.state.proxy.engine.mode == "exact"
    _, metrics = converse(app, dialect)
    recs = read_capture_log(tmp_path / "s1.jsonl").records
    assert len(recs) == TURNS and all(r.mode == "exact" for r in recs)
    assert recs[0].splice.new_root_reason == "new_conversation" and recs[0].splice.parent_call_id is None
    for prev, cur in zip(recs, recs[1:]):
        served = prev.prompt_ids + prev.completion_ids
        assert cur.splice.parent_call_id == prev.call_id and cur.splice.new_root_reason is None
        assert cur.splice.reused_tokens == len(served) and cur.prompt_ids[:len(served)] == served
        assert cur.splice.reused_tokens + cur.splice.rendered_tokens == len(cur.prompt_ids)
    assert f'tracefleet_proxy_exact_calls_total{{kind="spliced"}} {TURNS - 1}.0' in metrics


def test_exact_mode_without_a_model_is_a_clear_error(tmp_path: Path):
    with pytest.raises(ValueError, match="model_path"):
        create_app(ProxyConfig(engine_url="http://127.0.0.1:9", capture_dir=tmp_path, admin_token="a", mode="exact"))
