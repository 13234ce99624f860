"""Faults: the engine dies mid-stream, the proxy is SIGKILLed mid-session, and a table of bad requests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from tracefleet.contract.capture import read_capture_log

from fixtures.servers import stop_process_group

LONG = " ".join(f"word{i}" for i in range(60))


def _chat(key: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    return "/v1/chat/completions", {"authorization": f"Bearer {key}"}, {
        "model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def _responses(key: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    return "/v1/responses", {"authorization": f"Bearer {key}"}, {"model": "m", "stream": True, "input": "hi", "store": False}


def _anthropic(key: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    return "/v1/messages?beta=true", {"x-api-key": key}, {
        "model": "c", "max_tokens": 200, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def _google(key: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    return "/v1beta/models/g:streamGenerateContent?alt=sse", {"x-goog-api-key": key}, {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


def _last_data(raw: str) -> dict[str, Any]:
    datas = [line[6:] for line in raw.replace("\r\n", "\n").split("\n") if line.startswith("data: ") and line != "data: [DONE]"]
    return orjson.loads(datas[-1])


def check_chat_error(raw: str) -> None:
    err = _last_data(raw)["error"]
    assert err["type"] == "server_error" and "engine" in err["message"] and "data: [DONE]" not in raw


def check_responses_error(raw: str) -> None:
    last = _last_data(raw)
    assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
    assert last["response"]["error"]["code"] == "server_error" and "engine" in last["response"]["error"]["message"]
    assert "response.completed" not in raw


def check_anthropic_error(raw: str) -> None:
    assert "event: error\n" in raw and "message_stop" not in raw
    last = _last_data(raw)
    assert last["type"] == "error" and last["error"]["type"] == "api_error" and "engine" in last["error"]["message"]


def check_google_error(raw: str) -> None:
    last = _last_data(raw)
    assert last["error"]["code"] == 502 and last["error"]["status"] == "UNAVAILABLE"


CASES = {"openai-chat": (_chat, check_chat_error), "openai-responses": (_responses, check_responses_error),
         "anthropic": (_anthropic, check_anthropic_error), "google": (_google, check_google_error)}


@pytest.mark.parametrize("dialect", list(CASES))
def test_engine_killed_mid_stream(make_scripted_engine, start_proxy, dialect):
    engine = make_scripted_engine({"token_delay_s": 0.05, "no_tools_text": LONG})
    proxy = start_proxy(engine.url)
    s = proxy.new_session()
    build, check = CASES[dialect]
    path, headers, body = build(s["secret"])
    raw = ""
    with httpx.stream("POST", proxy.url + path, headers=headers, json=body, timeout=60) as r:
        assert r.status_code == 200
        killed = False
        for text in r.iter_text():
            raw += text
            if not killed and raw.count("word") >= 4:
                engine.kill()
                killed = True
    assert killed
    check(raw)
    recs = read_capture_log(proxy.capture_dir / f"{s['session_id']}.jsonl").records
    assert len(recs) == 1
    rec = recs[0]
    assert rec.status == "partial" and rec.error is not None and rec.error.kind == "engine_disconnect"
    assert rec.completion_ids and len(rec.logprobs) == len(rec.completion_ids) and rec.prompt_ids
    assert rec.output_text and rec.output_text.startswith("word0 word1 word2") and len(rec.output_text) < len(LONG)
    assert proxy.admin("GET", f"/admin/sessions/{s['session_id']}").json()["errors"] == 1


def test_engine_death_surfaces_through_the_sdks(make_scripted_engine, start_proxy):
    """The official SDKs turn our error events into exceptions (not hangs or parse errors)."""
    engine = make_scripted_engine({"token_delay_s": 0.05, "no_tools_text": LONG})
    proxy = start_proxy(engine.url)
    s = proxy.new_session()
    oc = openai.OpenAI(base_url=proxy.url + "/v1", api_key=s["secret"], max_retries=0)
    seen = ""
    with pytest.raises(openai.APIError, match="engine"):
        for chunk in oc.chat.completions.create(model="m", stream=True, messages=[{"role": "user", "content": "hi"}]):
            seen += chunk.choices[0].delta.content or "" if chunk.choices else ""
            if seen.count("word") >= 3:
                engine.kill()
    # engine gone for good: a new call gets a dialect-shaped 503 (cannot connect), also via the SDK
    ac = anthropic.Anthropic(base_url=proxy.url, api_key=s["secret"], max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as exc:
        ac.messages.create(model="c", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert exc.value.status_code == 503 and exc.value.body["error"]["type"] == "overloaded_error"
    recs = read_capture_log(proxy.capture_dir / f"{s['session_id']}.jsonl").records
    assert [r.status for r in recs] == ["partial", "error"]
    assert [r.error.kind for r in recs] == ["engine_disconnect", "engine_unavailable"]


def test_non_streamed_call_when_engine_dies(make_scripted_engine, start_proxy):
    engine = make_scripted_engine({"token_delay_s": 0.05, "no_tools_text": LONG})
    proxy = start_proxy(engine.url)
    s = proxy.new_session()
    threading.Timer(0.8, engine.kill).start()
    r = httpx.post(proxy.url + "/v1/responses", headers={"authorization": f"Bearer {s['secret']}"},
                   json={"model": "m", "input": "hi"}, timeout=60)
    assert r.status_code == 502 and r.json()["error"]["type"] == "server_error"
    rec = read_capture_log(proxy.capture_dir / f"{s['session_id']}.jsonl").records[0]
    assert rec.status == "error" and rec.error.kind == "engine_disconnect"


def test_context_length_maps_to_each_dialect(make_scripted_engine, start_proxy):
    engine = make_scripted_engine(extra_args=["--max-model-len", "64"])
    proxy = start_proxy(engine.url)
    s = proxy.new_session()
    long = "please " * 200
    r = httpx.post(proxy.url + "/v1/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                   json={"model": "m", "messages": [{"role": "user", "content": long}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(proxy.url + "/v1/messages", headers={"x-api-key": s["secret"]},
                   json={"model": "c", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": long}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error" and "context length" in r.json()["error"]["message"]
    recs = read_capture_log(proxy.capture_dir / f"{s['session_id']}.jsonl").records
    assert [r.error.kind for r in recs] == ["context_length", "context_length"]


# -- the port file ---------------------------------------------------------------------------------

def _proxy_cli(engine_url: str, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    """`tracefleet proxy` on a free port, capturing into tmp_path/cap, its port written to tmp_path/port."""
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracefleet.cli", "proxy", "--engine", engine_url, "--capture-dir", str(tmp_path / "cap"),
         "--admin-token", "adm-token", "--port", "0", "--port-file", str(port_file), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, port_file


def _written_port(proc: subprocess.Popen, port_file: Path, poll_s: float) -> int:
    deadline = time.time() + 60
    while not port_file.exists():
        assert time.time() < deadline and proc.poll() is None, proc.stdout.read().decode() if proc.poll() is not None else "no port"
        time.sleep(poll_s)
    return int(port_file.read_text())


def test_the_port_file_names_a_port_that_already_accepts(make_scripted_engine, tmp_path: Path):
    """Issue 13: a harness connected to the port the file named before the proxy listened (refused). The
    proxy is frozen (SIGSTOP) the moment the file appears: the connection must still be taken (the kernel
    queues it), and answered once the proxy runs on."""
    proc, port_file = _proxy_cli(make_scripted_engine().url, tmp_path)
    try:
        port = _written_port(proc, port_file, poll_s=0.002)
        os.kill(proc.pid, signal.SIGSTOP)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:  # refused if not yet listening
            conn.sendall(b"GET /health HTTP/1.1\r\nhost: proxy\r\nconnection: close\r\n\r\n")
            os.kill(proc.pid, signal.SIGCONT)
            conn.settimeout(30)
            assert conn.recv(64).startswith(b"HTTP/1.1 200")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        stop_process_group(proc)


# -- proxy SIGKILLed mid-session ------------------------------------------------------------------

def test_proxy_sigkill_leaves_a_readable_log(make_scripted_engine, tmp_path: Path):
    engine = make_scripted_engine()
    capture = tmp_path / "cap"
    secret = "tfs-" + "k" * 24
    proc, port_file = _proxy_cli(engine.url, tmp_path, "--session", f"sess1:{secret}")
    try:
        url = f"http://127.0.0.1:{_written_port(proc, port_file, poll_s=0.05)}"
        oc = openai.OpenAI(base_url=url + "/s/sess1/v1", api_key=secret, max_retries=0)
        ac = anthropic.Anthropic(base_url=url, api_key=secret, max_retries=0)
        done = [oc.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).id.removeprefix("chatcmpl-"),
                ac.messages.create(model="c", max_tokens=50, messages=[{"role": "user", "content": "hi"}]).id.removeprefix("msg_"),
                oc.responses.create(model="m", input="hi").id.removeprefix("resp_")]
        engine.configure(token_delay_s=0.05, no_tools_text=LONG)
        with httpx.stream("POST", url + "/v1/messages", headers={"x-api-key": secret}, timeout=30,
                          json={"model": "c", "max_tokens": 200, "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
            for text in r.iter_text():
                if text.count("word") >= 1:
                    os.kill(proc.pid, signal.SIGKILL)
                    break
        proc.wait(10)
        assert proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    log = read_capture_log(capture / "sess1.jsonl")
    assert not log.bad_lines
    assert [r.call_id for r in log.records] == done  # every answered call is there, in order
    assert all(r.status == "ok" and r.completion_ids for r in log.records)
