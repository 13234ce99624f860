"""Real harnesses, unmodified, through the proxy app in exact mode (scripted engine, SmolLM2 tokenizer).

Each pinned CLI runs headless through its preset in a scratch git repository. The scripted engine asks
for two shell commands and then answers in text. In exact mode the agent loop's calls must form one
exact chain in the capture log: each call's prompt starts with the previous call's prompt + sampled ids.
Other calls a harness makes (titles, summaries, sub-agents) may start their own roots.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tracefleet.capture import read_capture_log
from tracefleet.engine.scripted import Script
from tracefleet.formats.families import load_model_format
from tracefleet.proxy.app import create_app
from tracefleet.proxy.config import ProxyConfig
from tracefleet.proxy.engine_client import EngineClient
from tracefleet.proxy.exact.engine import ExactTokenEngine
from tracefleet.runner.presets import REAL_HARNESSES, get_preset
from tracefleet.runner.sandbox import run_sandboxed

COMMANDS = ["echo exact-round-1 > note.txt", "echo exact-round-2 >> note.txt"]
FINAL_TEXT = "All done: note.txt has both lines."
ADMIN = "exact-admin-token"


def _serve(app: Any) -> tuple[uvicorn.Server, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        assert time.time() < deadline and thread.is_alive(), "proxy did not start"
        time.sleep(0.01)
    return server, sock.getsockname()[1]


def _repo(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "README.md").write_text("# scratch\n")
    git = ["git", "-c", "user.name=tracefleet", "-c", "user.email=tests@tracefleet.invalid"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=path, check=True)
    subprocess.run([*git, "add", "-A"], cwd=path, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], cwd=path, check=True)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_HARNESSES)
def test_real_harness_session_is_one_exact_chain(name: str, harness_binaries, scripted_engine, tmp_path: Path) -> None:
    scripted_engine.configure(**Script(tool_rounds=len(COMMANDS), commands=COMMANDS, final_text=FINAL_TEXT,
                                       tool_preference=[get_preset(name).shell_tool]).model_dump())
    engine = ExactTokenEngine(EngineClient(scripted_engine.url), load_model_format("smollm2"))
    config = ProxyConfig(engine_url=scripted_engine.url, capture_dir=tmp_path / "capture", admin_token=ADMIN, mode="exact")
    server, port = _serve(create_app(config, token_engine=engine))
    try:
        admin = {"authorization": f"Bearer {ADMIN}"}
        session = httpx.post(f"http://127.0.0.1:{port}/admin/sessions", json={}, headers=admin, timeout=30).json()
        workdir, home = _repo(tmp_path / "repo"), tmp_path / "home"
        launch = get_preset(name).launch(
            prompt="Write two lines to note.txt using the shell, then tell me you are done.", workdir=workdir,
            home=home, base_url=f"http://127.0.0.1:{port}{session['base_path']}", api_key=session["secret"],
            model="tracefleet-scripted")
        for rel, content in launch.files.items():
            (home / rel).parent.mkdir(parents=True, exist_ok=True)
            (home / rel).write_text(content)
        result = run_sandboxed(launch.argv, cwd=workdir, home=home, env=launch.env, timeout_s=240,
                               stdout_path=tmp_path / "stdout.log", stderr_path=tmp_path / "stderr.log")
        closed = httpx.delete(f"http://127.0.0.1:{port}/admin/sessions/{session['session_id']}", headers=admin,
                              timeout=30).json()
    finally:
        server.should_exit = True
    transcript = f"{(tmp_path / 'stdout.log').read_text()[-3000:]}\n{(tmp_path / 'stderr.log').read_text()[-3000:]}"
    assert result.exit_code == 0 and not result.timed_out, transcript
    assert (workdir / "note.txt").read_text() == "exact-round-1\nexact-round-2\n", transcript
    recs = read_capture_log(closed["capture_path"]).records
    assert recs and all(r.mode == "exact" and r.status == "ok" and not r.tool_parse_errors for r in recs)
    # the agent loop: the calls that asked for the commands and the one that gave the final answer
    loop = [r for r in recs if any(c["name"] == get_preset(name).shell_tool for c in r.tool_calls)
            or FINAL_TEXT in (r.output_text or "")]
    assert len(loop) >= len(COMMANDS) + 1, [(r.call_id, r.tool_calls) for r in recs]
    for prev, cur in zip(loop, loop[1:]):
        served = prev.prompt_ids + prev.completion_ids
        assert cur.prompt_ids[:len(served)] == served, (name, prev.call_id, cur.call_id)
    roots = [r for r in recs if not any(
        r.prompt_ids[:len(p.prompt_ids) + len(p.completion_ids)] == p.prompt_ids + p.completion_ids
        for p in recs if p is not r and p.timings.received_at <= r.timings.received_at)]
    print(f"\n{name}: {len(recs)} calls, {len(loop)} in the agent loop (one exact chain), {len(roots)} roots; "
          f"new-root reasons {engine.new_root_reasons}; reused {engine.stats['reused_tokens']} / rendered "
          f"{engine.stats['rendered_tokens']} prompt tokens")
