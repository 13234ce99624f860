"""A real harness that gives up on a call and retries it: Qwen Code with a short client timeout
(`QWEN_CODE_API_TIMEOUT_MS`) against an engine that is slow to start its first answer. Every
attempt is recorded, the abandoned one as `client_disconnect` and cancelled at the engine; the retry
is answered and the session goes on from it (the abandoned attempt is never a parent in the traces)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tracefleet.contract.proxy_plan import ProxyPlan
from tracefleet.contract.capture import read_capture_log
from tracefleet.engine.scripted import Script
from tracefleet.runner.evaluators import EvaluatorSpec
from tracefleet.runner.netns import UnixToTcpBridge
from tracefleet.runner.presets import get_preset
from tracefleet.runner.proxy_admin import ProxyAdmin
from tracefleet.runner.sandbox import netns_available
from tracefleet.runner.services import InProcessProxy
from tracefleet.runner.session import HarnessConfig, SessionPlan, SessionRun, run_session
from tracefleet.runner.task import Task

COMMANDS = ["echo tracefleet-round-1 > note.txt"]
CLIENT_TIMEOUT_MS = 3000


@pytest.mark.slow
@pytest.mark.parametrize("harness_binary", ["qwen-code"], indirect=True)
def test_qwen_code_retry_after_its_client_timeout(harness_binary: Path, scripted_engine: Any, tmp_path: Path) -> None:
    script = Script(tool_rounds=len(COMMANDS), commands=COMMANDS, final_text="Done.",
                    tool_preference=[get_preset("qwen-code").shell_tool])
    scripted_engine.configure(**script.model_copy(update={"first_token_delay_s": 30.0}).model_dump())
    proxy = InProcessProxy(ProxyPlan(engine_url=scripted_engine.url, mode="server"), capture_dir=tmp_path / "capture").start()
    bridge = None
    runs: list[SessionRun] = []
    try:
        # Qwen Code's client timeout for model calls (its default is 120 s; it then retries, up to 3 times)
        harness = HarnessConfig(preset="qwen-code", timeout_s=180, env={"QWEN_CODE_API_TIMEOUT_MS": str(CLIENT_TIMEOUT_MS)})
        if netns_available():
            bridge = UnixToTcpBridge(tmp_path / "bridge.sock", "127.0.0.1", proxy.port).start()
            harness = harness.model_copy(update={"netns": True, "bridge_socket": str(tmp_path / "bridge.sock")})
        plan = SessionPlan(
            index=0, session_id="qwen-retry", job="retries", group_id="retries/qwen", model="tracefleet-scripted",
            task=Task(id="note", prompt="Write a line to note.txt using the shell, then say you are done.",
                      files={"README.md": "# scratch\n"}),
            harness=harness, evaluator=EvaluatorSpec(type="command", command="test -s note.txt", timeout_s=60),
        )
        admin = ProxyAdmin(proxy.url, proxy.admin_token)
        worker = threading.Thread(target=lambda: runs.append(
            run_session(plan, admin=admin, proxy_url=proxy.url, session_root=tmp_path / "sessions")))
        worker.start()
        log = tmp_path / "capture" / "qwen-retry.jsonl"
        deadline = time.monotonic() + 120
        while not (log.exists() and read_capture_log(log).records) and time.monotonic() < deadline and worker.is_alive():
            time.sleep(0.1)
        # the first attempt was given up on: from now on the engine answers at once
        scripted_engine.configure(**script.model_dump())
        worker.join(240)
        admin.close()
    finally:
        if bridge is not None:
            bridge.close()
        proxy.stop()
    assert runs, "the session did not finish"
    r = runs[0].result
    session_dir = Path(r.session_dir)
    transcript = (f"{r.model_dump_json(indent=1)}\n--- stdout\n{(session_dir / 'harness.stdout').read_text()[-3000:]}"
                  f"\n--- stderr\n{(session_dir / 'harness.stderr').read_text()[-3000:]}")
    recs = read_capture_log(r.capture_path).records
    kinds = [rec.error.kind if rec.error else rec.status for rec in recs]
    assert kinds[0] == "client_disconnect", (kinds, transcript)
    retry = next(i for i, k in enumerate(kinds) if k == "ok")
    assert all(k == "client_disconnect" for k in kinds[:retry]) and recs[retry].request == recs[0].request, kinds
    assert r.abandoned_calls == retry and (r.status, r.reward) == ("completed", 1.0), transcript
    assert scripted_engine.running() == 0
    traced = {call_id for t in runs[0].traces for call_id in t.call_ids}
    assert recs[retry].call_id in traced and not traced & {rec.call_id for rec in recs[:retry]}
