"""Each real harness preset (Codex, Claude Code, Qwen Code, Pi, Gemini CLI, OpenCode) completes a whole
session through the runner (workspace, proxy registration, preset launch in the sandbox, capture, git
diff, evaluator, traces) against the scripted engine, which asks for two shell commands and then answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracefleet.contract.proxy_plan import ProxyPlan
from tracefleet.engine.scripted import Script
from tracefleet.runner.evaluators import EvaluatorSpec
from tracefleet.runner.netns import UnixToTcpBridge
from tracefleet.runner.presets import REAL_HARNESSES, get_preset
from tracefleet.runner.proxy_admin import ProxyAdmin
from tracefleet.runner.sandbox import netns_available
from tracefleet.runner.services import InProcessProxy
from tracefleet.runner.session import HarnessConfig, SessionPlan, run_session
from tracefleet.runner.task import Task

COMMANDS = ["echo tracefleet-round-1 > note.txt", "echo tracefleet-round-2 >> note.txt"]
JUDGE = "test \"$(cat note.txt)\" = \"$(printf 'tracefleet-round-1\\ntracefleet-round-2')\""


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_HARNESSES)
def test_real_harness_session_through_the_runner(name: str, harness_binaries, scripted_engine, tmp_path: Path) -> None:
    scripted_engine.configure(**Script(
        tool_rounds=len(COMMANDS), commands=COMMANDS, final_text="Done: note.txt written.",
        tool_preference=[get_preset(name).shell_tool],
    ).model_dump())
    proxy = InProcessProxy(ProxyPlan(engine_url=scripted_engine.url, mode="server"), capture_dir=tmp_path / "capture").start()
    bridge = None
    try:
        harness = HarnessConfig(preset=name, timeout_s=240)
        if netns_available():
            bridge = UnixToTcpBridge(tmp_path / "bridge.sock", "127.0.0.1", proxy.port).start()
            harness = harness.model_copy(update={"netns": True, "bridge_socket": str(tmp_path / "bridge.sock")})
        plan = SessionPlan(
            index=1, session_id=f"{name}-1", job="harnesses", group_id=f"harnesses/{name}",
            task=Task(id="note", prompt="Write two lines to note.txt using the shell, then say you are done.",
                      files={"README.md": "# scratch\n"}),
            harness=harness, evaluator=EvaluatorSpec(type="command", command=JUDGE, timeout_s=60),
            model="tracefleet-scripted",
        )
        admin = ProxyAdmin(proxy.url, proxy.admin_token)
        run = run_session(plan, admin=admin, proxy_url=proxy.url, session_root=tmp_path / "sessions")
        admin.close()
    finally:
        if bridge is not None:
            bridge.close()
        proxy.stop()
    r = run.result
    session_dir = Path(r.session_dir)
    transcript = (f"{r.model_dump_json(indent=1)}\n--- stdout\n{(session_dir / 'harness.stdout').read_text()[-4000:]}"
                  f"\n--- stderr\n{(session_dir / 'harness.stderr').read_text()[-3000:]}")
    assert (r.status, r.harness_exit_code, r.reward) == ("completed", 0, 1.0), transcript
    assert "tracefleet-round-2" in (session_dir / "session.patch").read_text()
    assert r.calls >= len(COMMANDS) + 1 and r.call_errors == 0, transcript
    assert run.traces and r.trainable_tokens > 0
    assert all(t.meta.reward == 1.0 and t.meta.harness == name for t in run.traces)
