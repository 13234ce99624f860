#!/usr/bin/env python
"""Record the capture-log fixtures in tests/traces/data/ from real harness sessions through the proxy.

For each harness: a `tracefleet engine --backend scripted` subprocess (SmolLM2's real tokenizer and chat
template; two shell tool rounds, then a final text), a `tracefleet proxy` subprocess in front of it (server
mode, loopback, port 0), one session registered through the admin API, the pinned harness CLI run headless
through its preset (`tracefleet.runner.presets`) in a scratch git repository with a fresh HOME - inside a
loopback-only network namespace bridged to the proxy where user namespaces allow - and, after the session
is closed (log flushed), the proxy's capture log copied verbatim to tests/traces/data/recorded-<harness>.jsonl.

    .venv/bin/python hack/record_fixtures.py                  # all six harnesses
    .venv/bin/python hack/record_fixtures.py codex opencode   # some of them
    .venv/bin/python hack/record_fixtures.py --out /tmp/rec   # somewhere else

Needs the harness CLIs (`bash hack/setup.d/50-harnesses.sh`) and the engine's tokenizer
(`bash hack/setup.d/40-engine.sh`). The engine is deterministic, so a re-recording differs from the
committed files only in ids, timestamps and whatever the harness itself varies (dates, paths, its version).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tracefleet.capture import read_capture_log
from tracefleet.engine.scripted import Script
from tracefleet.runner.netns import UnixToTcpBridge
from tracefleet.runner.presets import REAL_HARNESSES, get_preset, installed_binary
from tracefleet.runner.proxy_admin import ProxyAdmin
from tracefleet.runner.sandbox import SandboxOptions, netns_available, run_sandboxed

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "tests" / "traces" / "data"
MODEL = "tracefleet-scripted"  # what the harness asks for; the proxy maps it to the served model
PROMPT = "Write two lines to note.txt using the shell, then tell me you are done."
COMMANDS = ["echo tracefleet-round-1 > note.txt", "echo tracefleet-round-2 >> note.txt"]
FINAL_TEXT = "All done: note.txt has both lines."
EXPECTED_NOTE = "tracefleet-round-1\ntracefleet-round-2\n"
HARNESS_TIMEOUT_S = 240


def child_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "TRANSFORMERS_VERBOSITY": "error"}


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_ok(url: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[3]} exited {proc.returncode}:\n{log.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f}s")


def start_engine(work: Path) -> tuple[subprocess.Popen, str]:
    """`tracefleet engine --backend scripted` on a free port; returns (process, root URL)."""
    log = work / "engine.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracefleet", "engine", "--backend", "scripted", "--model", "smollm2",
         "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(), cwd=REPO,
        start_new_session=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 180
    url = ""
    with open(log, "w") as sink:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            sink.write(line)
            if line.startswith("{") and '"listening"' in line:
                url = json.loads(line)["url"]
                break
    if not url:
        stop(proc)
        raise RuntimeError(f"the scripted engine did not start:\n{log.read_text()[-2000:]}")
    # Keep draining its output so a chatty engine never blocks on a full pipe.
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    wait_ok(url + "/health", proc, log, 180)
    return proc, url


def start_proxy(engine_url: str, work: Path, admin_token: str) -> tuple[subprocess.Popen, int]:
    """`tracefleet proxy` (server mode) on a free port; returns (process, port)."""
    port_file = work / "proxy.port"
    log = work / "proxy.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracefleet", "proxy", "--engine", engine_url, "--capture-dir", str(work / "capture"),
         "--port", "0", "--port-file", str(port_file), "--log-level", "warning"],
        env={**child_env(), "TRACEFLEET_ADMIN_TOKEN": admin_token}, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"the proxy did not start:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)
    port = int(port_file.read_text())
    wait_ok(f"http://127.0.0.1:{port}/", proc, log, 60)
    return proc, port


def scratch_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "README.md").write_text("# scratch\nA tiny repository for a harness test.\n")
    git = ["git", "-c", "user.name=tracefleet", "-c", "user.email=tests@tracefleet.invalid"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=path, check=True)
    subprocess.run([*git, "add", "-A"], cwd=path, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], cwd=path, check=True)
    return path


def record(name: str, engine_url: str, work: Path, out: Path) -> dict:
    """One headless session of `name` through a fresh proxy; the capture log lands in `out`."""
    httpx.put(engine_url + "/scripted/script", timeout=10, json=Script(
        tool_rounds=len(COMMANDS), commands=COMMANDS, final_text=FINAL_TEXT,
        tool_preference=[get_preset(name).shell_tool]).model_dump()).raise_for_status()
    token = secrets.token_urlsafe(24)
    proxy, port = start_proxy(engine_url, work, token)
    bridge = None
    admin = ProxyAdmin(f"http://127.0.0.1:{port}", token)
    try:
        session = admin.create_session(session_id=f"rec-{name}", metadata={"harness": name})
        options = SandboxOptions()
        use_netns = netns_available()
        if use_netns:
            socket_path = work / "bridge.sock"
            bridge = UnixToTcpBridge(socket_path, "127.0.0.1", port).start()
            options = SandboxOptions(netns=True, bridge_port=port, bridge_socket=socket_path)
        workdir = scratch_repo(work / "repo")
        home = work / "home"
        launch = get_preset(name).launch(prompt=PROMPT, workdir=workdir, home=home,
                                         base_url=f"http://127.0.0.1:{port}{session.base_path}",
                                         api_key=session.secret, model=MODEL)
        for rel, content in launch.files.items():
            target = home / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        result = run_sandboxed(launch.argv, cwd=workdir, home=home, env=launch.env, timeout_s=HARNESS_TIMEOUT_S,
                               stdout_path=work / "stdout.log", stderr_path=work / "stderr.log", options=options)
        closed = admin.close_session(session.session_id)
        note = workdir / "note.txt"
        problems = []
        if result.exit_code != 0 or result.timed_out:
            problems.append(f"exit={result.exit_code} timed_out={result.timed_out}")
        if not note.exists() or note.read_text() != EXPECTED_NOTE:
            problems.append("note.txt does not hold both rounds")
        if closed.errors or not closed.capture_path:
            problems.append(f"session {closed}")
        if problems:
            tail = (work / "stdout.log").read_text(errors="replace")[-3000:] + (work / "stderr.log").read_text(
                errors="replace")[-3000:]
            raise RuntimeError(f"{name}: {'; '.join(problems)}\n{tail}")
        log = read_capture_log(closed.capture_path)
        if log.torn_tail or log.bad_lines or len(log.records) != closed.calls:
            raise RuntimeError(f"{name}: capture log incomplete ({closed})")
        target = out / f"recorded-{name}.jsonl"
        shutil.copyfile(closed.capture_path, target)
        return {"harness": name, "calls": closed.calls, "bytes": target.stat().st_size, "netns": use_netns,
                "seconds": round(result.duration_s, 1), "path": str(target.relative_to(REPO) if target.is_relative_to(REPO) else target)}
    finally:
        admin.close()
        if bridge is not None:
            bridge.close()
        stop(proxy)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("harnesses", nargs="*", default=list(REAL_HARNESSES), help=f"default: {' '.join(REAL_HARNESSES)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where the logs go (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    unknown = [n for n in args.harnesses if n not in REAL_HARNESSES]
    missing = [n for n in args.harnesses if n in REAL_HARNESSES and installed_binary(n) is None]
    if unknown or missing:
        print(f"unknown: {unknown}; not installed (run bash hack/setup.d/50-harnesses.sh): {missing}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="tracefleet-record-") as tmp:
        engine, engine_url = start_engine(Path(tmp))
        try:
            for name in args.harnesses:
                work = Path(tmp) / name
                work.mkdir()
                try:
                    print(json.dumps(record(name, engine_url, work, args.out)), flush=True)
                except Exception as exc:  # noqa: BLE001 - report and go on with the next harness
                    failed += 1
                    print(f"FAILED {name}: {exc}", file=sys.stderr, flush=True)
        finally:
            stop(engine)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
