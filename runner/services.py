"""The long-lived parts local mode starts: the CPU engine (a child process) and the proxy (in-process,
uvicorn on a thread), each on a free loopback port."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tracefleet.contract.proxy_plan import ProxyPlan
from tracefleet.process_group import die_with_parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, *, timeout_s: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"the engine exited with {proc.returncode} before it was ready:\n{tail}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(0.25)
    raise RuntimeError(f"{url} not healthy after {timeout_s:.0f}s ({last})")


@dataclass
class EngineProcess:
    url: str
    proc: subprocess.Popen
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()


def served_model_name(engine_url: str, *, timeout_s: float = 30.0) -> str:
    """The first model an OpenAI-compatible engine lists on /v1/models: the name harnesses must request
    (and the tokenizer exact mode loads, when none is configured). An engine that lists none is an error."""
    from tracefleet.proxy.engine_client import EngineModelsUnreadable, engine_model_cards

    try:
        cards = engine_model_cards(engine_url, timeout_s=timeout_s)
    except EngineModelsUnreadable as exc:
        raise RuntimeError(str(exc)) from exc
    if not cards:
        raise RuntimeError(f"the engine at {engine_url} serves no model ({engine_url.rstrip('/')}/v1/models lists none)")
    return cards[0]["id"]


def start_cpu_engine(model: str, log: Path, *, threads: int = 1, timeout_s: float = 300,
                     max_model_len: int | None = None, backend: str = "llama",
                     extra_args: list[str] | None = None) -> EngineProcess:
    """`tracefleet engine --backend llama --model MODEL --port 0` (or `backend` scripted, with `extra_args`
    such as `--script FILE`) as a child in its own process group (a Ctrl-C at the terminal reaches only us, and
    we stop it in order). Its JSON `listening` line on stdout says where it listens. `max_model_len` None: the
    engine's own default context."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": str(threads)}
    argv = [
        sys.executable, "-m", "tracefleet.cli", "engine", "--backend", backend, "--model", model,
        "--host", "127.0.0.1", "--port", "0", "--threads", str(threads),
        *(["--max-model-len", str(max_model_len)] if max_model_len else []), *(extra_args or []),
    ]
    offset = log.stat().st_size if log.exists() else 0
    with open(log, "ab") as out:
        # it dies with this driver however that ends (an engine left behind holds its memory for ever)
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=die_with_parent())
    engine = EngineProcess(url="", proc=proc, log=log)
    try:
        deadline = time.monotonic() + timeout_s
        while not engine.url:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the {backend} engine ({model}) did not start (exit {proc.poll()}); see {log}:\n{tail}")
            with open(log, "rb") as f:
                f.seek(offset)
                for line in f.read().decode(errors="replace").splitlines():
                    if line.startswith("{") and '"listening"' in line:
                        engine.url = json.loads(line)["url"].rstrip("/")
            time.sleep(0.2)
        wait_healthy(engine.url + "/health", timeout_s=max(5.0, deadline - time.monotonic()), proc=proc, log=log)
    except BaseException:
        engine.stop()
        raise
    return engine


class InProcessProxy:
    """The capture proxy (`tracefleet.proxy.app.create_app`) served by uvicorn on a thread, running the job's
    ProxyPlan (tracefleet.contract.plan.plan_proxy)."""

    def __init__(self, plan: ProxyPlan, *, capture_dir: Path, guide_url: str | None = None) -> None:
        from tracefleet.proxy.app import create_app
        from tracefleet.proxy.config import ProxyConfig
        from tracefleet.proxy.server import proxy_server

        self.admin_token = secrets.token_urlsafe(24)
        self.config = ProxyConfig.from_plan(plan, capture_dir=capture_dir, admin_token=self.admin_token,
                                            guide_url=guide_url)
        self.port = free_port()
        app = create_app(self.config)
        self.mode_decision = app.state.proxy.mode_decision
        # its calls still in flight when it stops are cut off and recorded (tracefleet.proxy.server)
        self._server = proxy_server(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on",
                                    timeout_keep_alive=30, access_log=False, proxy_headers=False)
        # uvicorn installs no signal handlers off the main thread: Ctrl-C stays ours to handle.
        self._thread = threading.Thread(target=self._server.run, name="tracefleet-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30) -> InProcessProxy:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the proxy did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)
