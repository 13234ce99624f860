"""Bad requests get the dialect's own error shape and a message naming the problem; sessions,
credentials, pause/resume, policy versions and metrics."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import openai
import pytest

from tracefleet.contract.capture import read_capture_log


def is_openai(body: dict[str, Any]) -> bool:
    e = body.get("error")
    return isinstance(e, dict) and set(e) == {"message", "type", "param", "code"}


def is_anthropic(body: dict[str, Any]) -> bool:
    return body.get("type") == "error" and set(body["error"]) == {"type", "message"}


def is_google(body: dict[str, Any]) -> bool:
    e = body.get("error")
    return isinstance(e, dict) and set(e) == {"code", "message", "status"} and isinstance(e["code"], int)


CHAT, RESP, MSGS, GEN = "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1beta/models/g:generateContent"
OK_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
BIG = {"model": "m", "messages": [{"role": "user", "content": "x" * 70_000}]}

# (name, method, path, key-header kind, body (dict → JSON, bytes → raw), status, shape, needle in message)
BAD = [
    ("chat malformed json", "POST", CHAT, "bearer", b'{"model": "m", "messages": [', 400, is_openai, "malformed JSON"),
    ("chat empty body", "POST", CHAT, "bearer", b"", 400, is_openai, "empty"),
    ("chat body not object", "POST", CHAT, "bearer", [1, 2], 400, is_openai, "JSON object"),
    ("chat messages missing", "POST", CHAT, "bearer", {"model": "m"}, 400, is_openai, "'messages'"),
    ("chat messages wrong type", "POST", CHAT, "bearer", {"model": "m", "messages": {"role": "user"}}, 400, is_openai, "expected array"),
    ("chat bad role", "POST", CHAT, "bearer", {"model": "m", "messages": [{"role": "robot", "content": "x"}]}, 400, is_openai, "messages[0].role"),
    ("chat temperature string", "POST", CHAT, "bearer", {**OK_CHAT, "temperature": "hot"}, 400, is_openai, "'temperature'"),
    ("chat tools wrong type", "POST", CHAT, "bearer", {**OK_CHAT, "tools": "shell"}, 400, is_openai, "'tools'"),
    ("chat wrong key", "POST", CHAT, "wrong", OK_CHAT, 401, is_openai, "invalid API key"),
    ("chat no key", "POST", CHAT, None, OK_CHAT, 401, is_openai, "missing API key"),
    ("chat oversized", "POST", CHAT, "bearer", BIG, 413, is_openai, "limit"),
    ("responses input missing", "POST", RESP, "bearer", {"model": "m"}, 400, is_openai, "'input'"),
    ("responses unknown item", "POST", RESP, "bearer", {"model": "m", "input": [{"type": "teleport"}]}, 400, is_openai, "teleport"),
    ("responses previous_response_id", "POST", RESP, "bearer", {"model": "m", "input": "x", "previous_response_id": "r1"}, 400, is_openai, "previous_response_id"),
    ("responses wrong key", "POST", RESP, "wrong", {"model": "m", "input": "x"}, 401, is_openai, "invalid API key"),
    ("anthropic max_tokens missing", "POST", MSGS, "x-api-key", {"model": "c", "messages": [{"role": "user", "content": "x"}]}, 400, is_anthropic, "max_tokens"),
    ("anthropic max_tokens wrong type", "POST", MSGS, "x-api-key", {"model": "c", "max_tokens": "10", "messages": []}, 400, is_anthropic, "'max_tokens'"),
    ("anthropic unknown block", "POST", MSGS, "x-api-key", {"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}, 400, is_anthropic, "hologram"),
    ("anthropic malformed json", "POST", MSGS, "x-api-key", b"{nope", 400, is_anthropic, "malformed JSON"),
    ("anthropic wrong key", "POST", MSGS, "wrong-x", {"model": "c", "max_tokens": 5, "messages": []}, 401, is_anthropic, "invalid API key"),
    ("anthropic oversized", "POST", MSGS, "x-api-key", {**BIG, "max_tokens": 5}, 413, is_anthropic, "limit"),
    ("anthropic count_tokens bad messages", "POST", MSGS + "/count_tokens", "x-api-key", {"model": "c", "messages": "x"}, 400, is_anthropic, "'messages'"),
    ("google contents missing", "POST", GEN, "goog", {}, 400, is_google, "'contents'"),
    ("google parts wrong type", "POST", GEN, "goog", {"contents": [{"role": "user", "parts": "hi"}]}, 400, is_google, "contents[0].parts"),
    ("google maxOutputTokens wrong type", "POST", GEN, "goog", {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"maxOutputTokens": "many"}}, 400, is_google, "maxOutputTokens"),
    ("google wrong key", "POST", GEN, "wrong-goog", {"contents": [{"parts": [{"text": "x"}]}]}, 401, is_google, "invalid API key"),
    ("google unknown action", "POST", "/v1beta/models/g:teleport", "goog", {"contents": []}, 404, is_google, "teleport"),
    ("unknown openai route", "POST", "/v1/embeddings-please", "bearer", {}, 404, is_openai, "unknown route"),
    ("unknown anthropic route", "GET", "/v1/messages/batches", "x-api-key", None, 404, is_anthropic, "unknown route"),
    ("wrong method", "GET", CHAT, "bearer", None, 405, is_openai, "not allowed"),
    ("prefix with another session's key", "POST", "/s/{other}" + CHAT, "bearer", OK_CHAT, 401, is_openai, "invalid API key for session"),
    ("prefix of unknown session", "POST", "/s/nobody" + MSGS, "x-api-key", {"model": "c", "max_tokens": 5, "messages": []}, 401, is_anthropic, "nobody"),
]


@pytest.fixture
def proxy(scripted_engine, start_proxy):
    return start_proxy(scripted_engine.url, max_body_bytes=64 * 1024)


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_request_table(proxy, case):
    name, method, path, key, body, status, shape, needle = case
    s, other = proxy.new_session(), proxy.new_session()
    headers = {"bearer": {"authorization": f"Bearer {s['secret']}"}, "wrong": {"authorization": "Bearer sk-not-a-session"},
               "x-api-key": {"x-api-key": s["secret"]}, "wrong-x": {"x-api-key": "sk-ant-wrong"},
               "goog": {"x-goog-api-key": s["secret"]}, "wrong-goog": {"x-goog-api-key": "AIza-wrong"}, None: {}}[key]
    kwargs: dict[str, Any] = {"headers": headers, "timeout": 30}
    if isinstance(body, bytes):
        kwargs["content"] = body
    elif body is not None:
        kwargs["json"] = body
    r = httpx.request(method, proxy.url + path.replace("{other}", other["session_id"]), **kwargs)
    assert r.status_code == status, r.text
    data = r.json()
    assert shape(data), data
    assert needle in r.text, data
    # nothing was recorded, and no session was made up for a stranger
    assert not (proxy.capture_dir / f"{s['session_id']}.jsonl").exists()
    assert proxy.app.state.proxy.sessions.active_count() == 2


def test_bad_request_table_is_broad():
    assert len(BAD) >= 20
    assert {c[6] for c in BAD} == {is_openai, is_anthropic, is_google}


def test_sessions_and_admin_auth(scripted_engine, start_proxy):
    proxy = start_proxy(scripted_engine.url)
    assert proxy.admin("POST", "/admin/sessions", {}, token="nope").status_code == 403
    assert httpx.post(proxy.url + "/admin/sessions", json={}).status_code == 401
    s = proxy.new_session(session_id="task-7-sample-0", metadata={"task": "7"})
    assert s["session_id"] == "task-7-sample-0" and s["base_path"] == "/s/task-7-sample-0"
    assert proxy.admin("POST", "/admin/sessions", {"session_id": "task-7-sample-0"}).status_code == 409
    assert proxy.admin("POST", "/admin/sessions", {"session_id": "../etc"}).status_code == 400
    oc = openai.OpenAI(base_url=proxy.url + s["base_path"] + "/v1", api_key=s["secret"], max_retries=0)
    assert oc.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).choices[0].message.content
    closed = proxy.admin("DELETE", f"/admin/sessions/{s['session_id']}").json()
    assert closed["active"] is False and closed["calls"] == 1
    with pytest.raises(openai.AuthenticationError, match="closed"):
        oc.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert proxy.admin("GET", "/admin/sessions/nope").status_code == 404
    assert len(read_capture_log(closed["capture_path"]).records) == 1


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/admin/sessions", {"secret": "short"}, "secret"),
    ("/admin/sessions", {"session_id": 7}, "session_id"),
    ("/admin/sessions", {"metadata": [1]}, "metadata"),
    ("/admin/pause", {"max_wait_s": -1}, "max_wait_s"),
    ("/admin/pause", {"max_wait_s": True}, "max_wait_s"),
    ("/admin/policy-version", {"version": "9"}, "version"),
    ("/admin/policy-version", {}, "version"),
])
def test_admin_bodies_are_checked_by_the_contract_models(scripted_engine, start_proxy, path, body, field):
    """The admin server reads its bodies with tracefleet.contract.proxy_admin's models: a body that does not
    fit is one 400 in the proxy's error shape naming the field; its client reads the answers with them."""
    from tracefleet.contract.proxy_admin import ControlsState, ProxySession
    from tracefleet.runner.proxy_admin import ProxyAdmin

    proxy = start_proxy(scripted_engine.url)
    r = proxy.admin("POST", path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == field
    assert error["message"].startswith(f"'{field}': ") and "\n" not in error["message"]
    client = ProxyAdmin(proxy.url, proxy.app.state.proxy.config.admin_token)
    try:
        created = client.create_session("s-typed", metadata={"task": "7"})
        assert created.base_path == "/s/s-typed" and created.metadata == {"task": "7"}
        assert client.session("s-typed") == ProxySession.model_validate(created.model_dump())
        assert client.close_session("s-typed").active is False
    finally:
        client.close()
    ControlsState.model_validate(proxy.admin("POST", "/admin/resume").json())


def test_pause_resume_and_policy_version(make_scripted_engine, start_proxy):
    engine = make_scripted_engine({"token_delay_s": 0.02})
    proxy = start_proxy(engine.url)
    s = proxy.new_session()
    hdr = {"authorization": f"Bearer {s['secret']}"}

    def chat() -> httpx.Response:
        return httpx.post(proxy.url + "/v1/chat/completions", headers=hdr, json=OK_CHAT, timeout=60)

    assert proxy.admin("POST", "/admin/policy-version", {"version": 7}).json()["policy_version"] == 7
    assert chat().status_code == 200
    # an in-flight stream started before the pause finishes normally
    results: dict[str, Any] = {}

    def stream_call() -> None:
        with httpx.stream("POST", proxy.url + "/v1/messages", headers={"x-api-key": s["secret"]}, timeout=60,
                          json={"model": "c", "max_tokens": 100, "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
            results["stream"] = r.read().decode()

    t = threading.Thread(target=stream_call)
    t.start()
    time.sleep(0.3)
    assert proxy.admin("POST", "/admin/pause", {"max_wait_s": 0.5}).json()["paused"] is True
    t0 = time.monotonic()
    r = chat()
    waited = time.monotonic() - t0
    assert r.status_code == 429 and r.headers["retry-after"] == "5" and waited >= 0.5
    assert r.json()["error"]["type"] == "rate_limit_error" and "paused" in r.json()["error"]["message"]
    r = httpx.post(proxy.url + "/v1/messages", headers={"x-api-key": s["secret"]}, timeout=30,
                   json={"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error" and "retry-after" in r.headers
    t.join(30)
    assert results["stream"].rstrip().endswith('data: {"type":"message_stop"}')
    metrics = httpx.get(proxy.url + "/metrics").text
    assert "tracefleet_proxy_paused 1.0" in metrics
    # a call waiting within the bound proceeds as soon as training resumes, under the new version
    proxy.admin("POST", "/admin/pause", {"max_wait_s": 20})
    threading.Timer(0.5, lambda: (proxy.admin("POST", "/admin/policy-version", {"version": 8}),
                                  proxy.admin("POST", "/admin/resume"))).start()
    t0 = time.monotonic()
    assert chat().status_code == 200
    assert 0.4 < time.monotonic() - t0 < 10
    recs = read_capture_log(proxy.capture_dir / f"{s['session_id']}.jsonl").records
    assert [(r.dialect, r.policy_version) for r in recs] == [("openai-chat", 7), ("anthropic", 7), ("openai-chat", 8)]
    assert proxy.admin("POST", "/admin/policy-version", {"version": "9"}).status_code == 400


def test_metrics(scripted_engine, start_proxy):
    proxy = start_proxy(scripted_engine.url)
    s = proxy.new_session()
    proxy.new_session()
    hdr = {"authorization": f"Bearer {s['secret']}"}
    for stream in (False, True):
        assert httpx.post(proxy.url + "/v1/chat/completions", headers=hdr, json={**OK_CHAT, "stream": stream}).status_code == 200
    assert httpx.post(proxy.url + "/v1/chat/completions", headers={"authorization": "Bearer bad"}, json=OK_CHAT).status_code == 401
    proxy.admin("POST", "/admin/policy-version", {"version": 3})
    text = httpx.get(proxy.url + "/metrics").text
    rec = read_capture_log(proxy.capture_dir / f"{s['session_id']}.jsonl").records
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line and not line.startswith("#")}
    assert values['tracefleet_proxy_calls_total{dialect="openai-chat",status="200"}'] == 2
    assert values['tracefleet_proxy_calls_total{dialect="openai-chat",status="401"}'] == 1
    assert values['tracefleet_proxy_errors_total{kind="authentication"}'] == 1
    assert values['tracefleet_proxy_prompt_tokens_total{dialect="openai-chat"}'] == sum(len(r.prompt_ids) for r in rec)
    assert values['tracefleet_proxy_completion_tokens_total{dialect="openai-chat"}'] == sum(len(r.completion_ids) for r in rec)
    assert values['tracefleet_proxy_ttft_seconds_count{dialect="openai-chat"}'] == 2
    assert values['tracefleet_proxy_latency_seconds_count{dialect="openai-chat"}'] == 2
    assert values["tracefleet_proxy_active_sessions"] == 2
    assert values["tracefleet_proxy_paused"] == 0
    assert values["tracefleet_proxy_policy_version"] == 3
