"""Calls a harness abandons mid-generation: recorded at once (`client_disconnect`, with what the engine
had produced), and the engine request cancelled (the engine's running-request gauge back to zero).
Also: a session closed with calls in flight cuts them off and records them before its log is sealed, and
so does the proxy when it is stopped (SIGTERM) with calls in flight."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tracefleet.contract.proxy_plan import ProxyPlan
from tracefleet.contract.capture import CaptureRecord, read_capture_log

from fixtures.abandoning_client import DIALECTS, abandon, request_bytes
from fixtures.capture_counts import assert_counts_true, metric, wait_for
from fixtures.servers import quiet_child_env, stop_process_group

LONG = " ".join(f"word{i}" for i in range(100))  # ~200 tokens at 20 ms each: generating for seconds


def records(capture_dir: Path, session_id: str) -> list[CaptureRecord]:
    path = capture_dir / f"{session_id}.jsonl"
    return read_capture_log(path).records if path.exists() else []


@pytest.fixture
def slow_engine(scripted_engine: Any) -> Any:
    scripted_engine.configure(token_delay_s=0.02, no_tools_text=LONG)
    return scripted_engine


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("dialect", "mode"), [(d, "server") for d in DIALECTS] + [("openai-chat", "exact")])
def test_abandoned_call_is_recorded_and_cancelled(slow_engine, start_proxy, dialect, mode, stream):
    proxy = start_proxy(slow_engine.url, mode=mode, **({"model_path": "smollm2"} if mode == "exact" else {}))
    s = proxy.new_session()
    url = urlsplit(proxy.url)
    # hang up once the engine is generating (a streamed call: once its first bytes arrived, and a little later)
    hung_up = abandon(url.hostname, url.port, request_bytes(dialect, stream, s["secret"]), stream, hold_s=10,
                      ready=lambda: slow_engine.running() == 1 and time.sleep(0.3) is None)
    recs = wait_for(lambda: records(proxy.capture_dir, s["session_id"]), 1.0)
    assert recs, f"no record within a second of the hang-up ({time.time() - hung_up:.2f}s)"
    rec = recs[0]
    assert rec.error is not None and rec.error.kind == "client_disconnect", rec
    assert rec.timings.done_at is not None and rec.timings.done_at - hung_up < 1.0
    assert rec.dialect == dialect and rec.stream == stream
    if stream or mode == "exact":  # what the engine had produced is kept (server mode: a whole answer's ids come with it)
        assert rec.status == "partial" and rec.prompt_ids and rec.completion_ids and rec.output_text.startswith("word0")
        assert len(rec.logprobs) == len(rec.completion_ids)
    assert wait_for(lambda: slow_engine.running() == 0, 5.0), "the engine request is still running"
    text = proxy.admin("GET", "/metrics").text
    assert_counts_true(recs, text)
    assert metric(text, "tracefleet_proxy_abandoned_calls_total", dialect=dialect, reason="client_disconnect") == 1
    assert metric(text, "tracefleet_proxy_engine_requests_cancelled_total") == 1
    info = proxy.admin("GET", f"/admin/sessions/{s['session_id']}").json()
    assert (info["calls"], info["errors"], info["abandoned"]) == (1, 1, 1)


def test_closing_a_session_cuts_off_its_calls_in_flight(slow_engine, start_proxy):
    """Two calls in flight (one streamed, one not) when the runner closes the session: both are
    recorded (`session_closed`) before the close returns, the engine runs nothing, the harness is told."""
    proxy = start_proxy(slow_engine.url)
    s, other = proxy.new_session(), proxy.new_session()
    answers: list[str] = []
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    def call(stream: bool) -> None:
        with httpx.stream("POST", proxy.url + "/v1/chat/completions", json={**body, "stream": stream},
                          headers={"authorization": f"Bearer {s['secret']}"}, timeout=30) as r:
            answers.append(f"{r.status_code} {r.read().decode()}")

    threads = [threading.Thread(target=call, args=(stream,)) for stream in (False, True)]
    for t in threads:
        t.start()
    assert wait_for(lambda: slow_engine.running() == 2, 10.0)
    assert metric(proxy.admin("GET", "/metrics").text, "tracefleet_proxy_session_in_flight_calls", session=s["session_id"]) == 2
    started = time.monotonic()
    info = proxy.admin("DELETE", f"/admin/sessions/{s['session_id']}").json()
    assert time.monotonic() - started < 1.0
    assert (info["abandoned"], info["calls"], info["errors"], info["active"]) == (2, 2, 2, False)
    recs = records(proxy.capture_dir, s["session_id"])
    assert sorted(r.stream for r in recs) == [False, True]
    assert {r.error.kind for r in recs if r.error} == {"session_closed"}
    assert wait_for(lambda: slow_engine.running() == 0, 5.0)
    for t in threads:
        t.join(10)
    assert len(answers) == 2 and all("session was closed" in a for a in answers), answers
    text = proxy.admin("GET", "/metrics").text
    assert_counts_true(recs, text)
    assert any(r.completion_tokens for r in recs)  # the streamed one had tokens when it was cut off
    assert metric(text, "tracefleet_proxy_abandoned_calls_total", dialect="openai-chat", reason="session_closed") == 2
    assert f'session="{s["session_id"]}"' not in text and f'session="{other["session_id"]}"' not in text


def test_a_retry_after_a_client_timeout_is_recorded_beside_the_abandoned_call(slow_engine, start_proxy):
    """Qwen Code's path: a non-streamed call given up on its client timeout, then sent again. The log
    holds both attempts (same request); the trace continues through the retry, never the abandoned one."""
    from tracefleet.traces import build_traces

    slow_engine.configure(token_delay_s=0.0)
    proxy = start_proxy(slow_engine.url)
    s = proxy.new_session()
    headers = {"authorization": f"Bearer {s['secret']}"}
    messages = [{"role": "user", "content": "hi"}]
    first = httpx.post(proxy.url + "/v1/chat/completions", headers=headers, json={"model": "m", "messages": messages},
                       timeout=30).json()
    messages += [first["choices"][0]["message"], {"role": "user", "content": "and now?"}]
    body = {"model": "m", "messages": messages}
    slow_engine.configure(token_delay_s=0.02, no_tools_text=LONG)
    with pytest.raises(httpx.ReadTimeout):  # the harness's own timeout
        httpx.post(proxy.url + "/v1/chat/completions", headers=headers, json=body, timeout=0.5)
    slow_engine.configure(token_delay_s=0.0)
    assert httpx.post(proxy.url + "/v1/chat/completions", headers=headers, json=body, timeout=30).status_code == 200
    recs = records(proxy.capture_dir, s["session_id"])
    assert [(r.status, r.error.kind if r.error else None) for r in recs] == [
        ("ok", None), ("error", "client_disconnect"), ("ok", None)]
    assert recs[1].request == recs[2].request  # the pair
    result = build_traces(proxy.capture_dir / f"{s['session_id']}.jsonl")
    assert [t.call_ids for t in result.traces] == [[recs[0].call_id, recs[2].call_id]]
    assert result.stats.dropped == {"error:client_disconnect": 1}
    assert wait_for(lambda: slow_engine.running() == 0, 5.0)


@pytest.mark.parametrize("mode", ["server", "exact"])
def test_stopping_the_proxy_cuts_off_its_calls_in_flight(slow_engine, tmp_path: Path, mode: str):
    """`tracefleet proxy` as the pod sidecar runs it (`--session`, `--upload-to`), SIGTERMed with a streamed
    (Anthropic) and a whole (Chat) call generating: it exits within seconds instead of waiting for the engine;
    both calls are recorded (`proxy_shutdown`, with the tokens they had: in server mode a whole answer's ids
    come only with its end) in the log it uploads, the engine runs nothing, and each harness got its dialect's
    retryable error."""
    capture, upload, port_file = tmp_path / "cap", tmp_path / "up", tmp_path / "port"
    sid, secret = "sess1", "tfs-" + "s" * 24
    with open(tmp_path / "proxy.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tracefleet", "proxy", "--engine", slow_engine.url, "--capture-dir", str(capture),
             "--port", "0", "--port-file", str(port_file), "--session", f"{sid}:{secret}", "--upload-to", str(upload),
             "--artifacts-dir", str(tmp_path / "no-artifacts"), "--mode", mode,
             *(["--model-path", "smollm2"] if mode == "exact" else [])],
            env=quiet_child_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert wait_for(port_file.exists, 60.0), (tmp_path / "proxy.log").read_text()
        url = f"http://127.0.0.1:{int(port_file.read_text())}"
        answers: dict[str, tuple[int, str]] = {}

        def call(name: str, path: str, body: dict[str, Any]) -> None:
            with httpx.stream("POST", url + path, json=body, timeout=30,
                              headers={"authorization": f"Bearer {secret}", "x-api-key": secret}) as r:
                answers[name] = (r.status_code, r.read().decode())

        threads = [threading.Thread(target=call, args=args) for args in (
            ("streamed", "/v1/messages", {"model": "m", "max_tokens": 500, "stream": True,
                                          "messages": [{"role": "user", "content": "hi"}]}),
            ("whole", "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}))]
        for t in threads:
            t.start()
        assert wait_for(lambda: slow_engine.running() == 2, 10.0)
        time.sleep(0.3)  # a few tokens generated
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        stopped_s = time.monotonic() - started
        print(f"stopped in {stopped_s:.2f}s")
        assert stopped_s < 3.0, f"the proxy took {stopped_s:.1f}s to stop"
        for t in threads:
            t.join(10)
    finally:
        stop_process_group(proc)
    log = read_capture_log(capture / f"{sid}.jsonl")
    assert not log.torn_tail and not log.bad_lines
    recs = log.records
    assert sorted((r.dialect, r.stream) for r in recs) == [("anthropic", True), ("openai-chat", False)], recs
    assert {r.error.kind for r in recs if r.error} == {"proxy_shutdown"} and all(r.error for r in recs)
    for rec in recs if mode == "exact" else [r for r in recs if r.stream]:
        assert rec.status == "partial" and rec.completion_ids and rec.output_text.startswith("word0"), rec
        assert len(rec.logprobs) == len(rec.completion_ids)
    assert_counts_true(recs)
    assert wait_for(lambda: slow_engine.running() == 0, 5.0), "the engine requests are still running"
    status, text = answers["streamed"]
    assert status == 200 and "event: error" in text and "overloaded_error" in text and "shutting down" in text, text
    status, text = answers["whole"]
    assert status == 503 and '"code":"proxy_shutdown"' in text, text
    uploaded = read_capture_log(upload / "capture.jsonl").records
    assert sorted(r.call_id for r in uploaded) == sorted(r.call_id for r in recs)


def test_stopping_the_runners_proxy_cuts_off_its_calls_in_flight(slow_engine, tmp_path: Path):
    """The local runner's proxy (`InProcessProxy`, stopped when `tracefleet run` ends or is interrupted) does
    the same: its stop returns promptly, the streamed call in flight recorded and told, the engine idle."""
    from tracefleet.runner.proxy_admin import ProxyAdmin
    from tracefleet.runner.services import InProcessProxy

    proxy = InProcessProxy(ProxyPlan(engine_url=slow_engine.url, mode="server"), capture_dir=tmp_path / "cap").start()
    try:
        s = ProxyAdmin(proxy.url, proxy.admin_token).create_session("run-1")
        answers: list[str] = []

        def call() -> None:
            with httpx.stream("POST", proxy.url + "/v1/chat/completions", timeout=30,
                              json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
                              headers={"authorization": f"Bearer {s.secret}"}) as r:
                answers.append(r.read().decode())

        caller = threading.Thread(target=call)
        caller.start()
        assert wait_for(lambda: slow_engine.running() == 1, 10.0)
        time.sleep(0.2)
        started = time.monotonic()
        proxy.stop()
        assert time.monotonic() - started < 3.0
    finally:
        proxy.stop()
    caller.join(10)
    [rec] = records(tmp_path / "cap", "run-1")
    assert rec.error is not None and rec.error.kind == "proxy_shutdown" and rec.status == "partial", rec
    assert answers and '"code":"proxy_shutdown"' in answers[0], answers
    assert wait_for(lambda: slow_engine.running() == 0, 5.0)
