"""`tracefleet engine-gate` as a managed inference pod runs it: a real process in front of a real engine (the scripted
`tracefleet engine`), seen by a client with and without the job's key."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fixtures.capture_counts import wait_for
from fixtures.servers import quiet_child_env, start_proxy_process, stop_process_group
from tracefleet.contract.capture import read_capture_log
from tracefleet.contract.podenv import ENGINE_API_KEY
from tracefleet.proxy.engine_client import _engine_error

KEY = secrets.token_urlsafe(32)
TOKEN_DELAY_S = 0.15


@pytest.fixture
def gate(make_scripted_engine, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    engine = make_scripted_engine({"no_tools_text": "one two three four five six",
                                   "token_delay_s": TOKEN_DELAY_S})
    port_file = tmp_path / "gate.port"
    proc = subprocess.Popen([sys.executable, "-m", "tracefleet", "engine-gate", "--engine", engine.url, "--host",
                             "127.0.0.1", "--port", "0", "--port-file", str(port_file)],
                            env=quiet_child_env(**{ENGINE_API_KEY: KEY}), start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "engine-gate did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text()}", engine
    finally:
        stop_process_group(proc)


def test_gate_refuses_without_the_key_and_streams_with_it(gate: tuple[str, Any]) -> None:
    gate, engine = gate
    chat = {"model": "smollm2", "messages": [{"role": "user", "content": "count"}], "stream": True}
    wrong = {"authorization": "Bearer " + KEY[:-1] + "x"}
    # generation, vLLM's pause (a dev route no --api-key covers) and a weight route: all 401, with or without a key
    for path, body in (("/v1/chat/completions", chat), ("/pause", {}), ("/update_weights", {"weights": "/x"})):
        for headers in ({}, wrong):
            r = httpx.post(gate + path, json=body, headers=headers, timeout=10)
            assert r.status_code == 401, (path, r.text)
            error = _engine_error(r.status_code, r.content)  # as the proxy reads an engine's refusal
            assert "engine key" in error.message and error.status == 502, error.message
    assert httpx.get(gate + "/tokenize", timeout=10).status_code == 401
    assert httpx.get(gate + "/health", timeout=10).status_code == 200  # the kubelet's probes need no key

    arrivals: list[float] = []
    text = ""
    with httpx.stream("POST", gate + "/v1/chat/completions", json=chat, timeout=30,
                      headers={"authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic())
                text += "".join(c["delta"].get("content") or "" for c in json.loads(line[6:])["choices"])
    assert text == "one two three four five six"
    # the engine sleeps before each token: chunk by chunk, the stream's events arrive spread over its tokens,
    # not all at once at the end
    assert len(arrivals) >= 6 and arrivals[-1] - arrivals[0] >= 3 * TOKEN_DELAY_S, arrivals

    # a client that goes away mid-stream closes the engine's request too (how vLLM learns to abort a generation)
    with httpx.stream("POST", gate + "/v1/chat/completions", json=chat, timeout=30,
                      headers={"authorization": f"Bearer {KEY}"}) as r:
        lines = r.iter_lines()  # held: a dropped line iterator closes the response
        assert next(lines).startswith("data: {")
        assert wait_for(lambda: engine.running() == 1, 5.0)
    assert wait_for(lambda: engine.running() == 0, 5.0), "the engine request is still running"


def test_the_proxy_reaches_the_engine_through_the_gate_with_the_job_key(gate: tuple[str, Any], tmp_path: Path) -> None:
    """The consumer: a `tracefleet proxy` given the key (as the operator gives its sidecar) captures a call through the
    gate; one without it gets the engine's refusal as a 502 naming its credentials."""
    url, _engine = gate
    chat = {"model": "smollm2", "messages": [{"role": "user", "content": "count"}], "max_tokens": 4}
    for key, status in ((KEY, 200), (None, 502)):
        (tmp_path / str(status)).mkdir()
        proxy = start_proxy_process(url, tmp_path / str(status), env={ENGINE_API_KEY: key} if key else None)
        try:
            admin = {"authorization": f"Bearer {proxy.admin_token}"}
            session = httpx.post(proxy.url + "/admin/sessions", headers=admin, json={}, timeout=10).json()
            r = httpx.post(proxy.url + "/v1/chat/completions", json=chat, timeout=30,
                           headers={"authorization": f"Bearer {session['secret']}"})
            assert r.status_code == status, r.text
            if key is not None:  # captured: the served token ids came back through the gate
                assert read_capture_log(proxy.capture_dir / f"{session['session_id']}.jsonl").records[0].completion_ids
            if key is None:
                assert "credentials" in r.json()["error"]["message"]
        finally:
            proxy.stop()
