"""One session end to end through the real proxy (in-process) and the scripted engine: statuses,
per-stage timings, captured calls never lost, rewards from the real `tests` evaluator."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tracefleet.contract.proxy_plan import ProxyPlan
from tracefleet.contract.capture import read_capture_log
from tracefleet.runner.evaluators import EvaluatorSpec
from tracefleet.runner.netns import UnixToTcpBridge
from tracefleet.runner.proxy_admin import ProxyAdmin
from tracefleet.runner.services import InProcessProxy
from tracefleet.runner.session import HarnessConfig, SessionPlan, run_session
from tracefleet.runner.task import Task

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"

# A minimal harness: N chat calls through the proxy (OPENAI_* from the command preset), then an action.
HARNESS = textwrap.dedent(
    """
    import json, os, sys, time, urllib.request
    calls, action = int(sys.argv[1]), sys.argv[2]
    messages = [{"role": "user", "content": os.environ["TRACEFLEET_PROMPT"]}]
    for _ in range(calls):
        req = urllib.request.Request(
            os.environ["OPENAI_BASE_URL"] + "/chat/completions",
            data=json.dumps({"model": os.environ["OPENAI_MODEL"], "messages": messages, "max_tokens": 16}).encode(),
            headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
        )
        answer = json.load(urllib.request.urlopen(req, timeout=60))
        msg = answer["choices"][0]["message"]
        messages.append({"role": "assistant", "content": msg.get("content") or ""})
        messages.append({"role": "user", "content": "go on"})
    if action == "fix":
        src = open("calc.py").read().replace("return a - b", "return a + b")
        open("calc.py", "w").write(src)
    elif action == "hang":
        print("hanging", flush=True)
        time.sleep(600)
    elif action == "crash":
        sys.exit(3)
    """
)


@pytest.fixture
def proxy(scripted_engine: Any, tmp_path: Path) -> Iterator[InProcessProxy]:
    url = getattr(scripted_engine, "url", scripted_engine)
    p = InProcessProxy(ProxyPlan(engine_url=str(url), mode="server"), capture_dir=tmp_path / "capture").start()
    try:
        yield p
    finally:
        p.stop()


def plan_for(tmp_path: Path, action: str, *, calls: int = 2, timeout_s: float = 120,
             evaluator: EvaluatorSpec | None = None, session_id: str = "s1") -> SessionPlan:
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    task = Task(
        id="calc", prompt="fix add", repo=str(QUICKSTART / "tasks" / "calc"),
        FAIL_TO_PASS=["test_calc.py::test_add"], PASS_TO_PASS=["test_calc.py::test_mul"], protected=["test_calc.py"],
    )
    return SessionPlan(
        index=0, session_id=session_id, job="t", task=task, sample_index=0, group_id="t/calc",
        harness=HarnessConfig(preset="command", command=[sys.executable, str(script), str(calls), action], timeout_s=timeout_s),
        evaluator=evaluator or EvaluatorSpec(type="tests"),
        model="default",
    )


def go(plan: SessionPlan, proxy: InProcessProxy, tmp_path: Path):  # noqa: ANN201
    admin = ProxyAdmin(proxy.url, proxy.admin_token)
    try:
        return run_session(plan, admin=admin, proxy_url=proxy.url, session_root=tmp_path / "sessions")
    finally:
        admin.close()


def assert_capture_kept(run, calls: int) -> None:  # noqa: ANN001
    r = run.result
    assert r.calls == calls
    log = read_capture_log(r.capture_path)
    assert len(log.records) == calls and not log.torn_tail
    assert all(rec.completion_ids and rec.prompt_ids for rec in log.records)
    assert run.traces and sum(t.num_trainable for t in run.traces) == sum(len(x.completion_ids) for x in log.records)


def test_fixing_session_completes_with_reward_1(proxy: InProcessProxy, tmp_path: Path) -> None:
    run = go(plan_for(tmp_path, "fix"), proxy, tmp_path)
    r = run.result
    assert (r.status, r.stage, r.reward) == ("completed", None, 1.0), r.error
    assert r.harness_exit_code == 0 and r.evaluation.details["resolved"] is True
    assert {"prepare", "register", "harness", "capture", "collect", "evaluate", "build", "total"} <= set(r.timings)
    assert "+    return a + b" in (Path(r.session_dir) / "session.patch").read_text()
    assert_capture_kept(run, 2)
    assert all(t.meta.reward == 1.0 and t.meta.outcome == "ok" for t in run.traces)


def test_non_fixing_session_gets_reward_0(proxy: InProcessProxy, tmp_path: Path) -> None:
    run = go(plan_for(tmp_path, "nothing"), proxy, tmp_path)
    assert (run.result.status, run.result.reward) == ("completed", 0.0)
    assert run.result.evaluation.details["fail_to_pass"] == {"test_calc.py::test_add": False}
    assert_capture_kept(run, 2)


def test_timeout_kills_the_harness_and_keeps_its_calls(proxy: InProcessProxy, tmp_path: Path) -> None:
    run = go(plan_for(tmp_path, "hang", calls=1, timeout_s=8), proxy, tmp_path)
    r = run.result
    assert (r.status, r.stage, r.reward) == ("timeout", "harness", 0.0)
    assert r.timings["harness"] < 20 and r.evaluation is None
    assert_capture_kept(run, 1)
    assert all(t.meta.outcome == "fail_closed" and (t.meta.reward or 0) <= 0 for t in run.traces)
    assert all(t.meta.fail_closed_reasons[:1] == ["session_timeout:harness"] for t in run.traces)


def test_harness_crash_is_an_error_at_the_harness_stage(proxy: InProcessProxy, tmp_path: Path) -> None:
    run = go(plan_for(tmp_path, "crash", calls=2), proxy, tmp_path)
    r = run.result
    assert (r.status, r.stage, r.harness_exit_code, r.reward) == ("error", "harness", 3, 0.0)
    assert_capture_kept(run, 2)
    assert all(t.meta.outcome == "fail_closed" for t in run.traces)
    assert all(t.meta.fail_closed_reasons[:1] == ["session_error:harness"] for t in run.traces)


def test_evaluator_crash_fails_closed(proxy: InProcessProxy, tmp_path: Path) -> None:
    spec = EvaluatorSpec(type="python", entrypoint="tracefleet_no_such_module:judge")
    run = go(plan_for(tmp_path, "fix", evaluator=spec), proxy, tmp_path)
    r = run.result
    assert (r.status, r.stage, r.reward) == ("error", "evaluate", 0.0)
    assert r.evaluation.status == "error"
    assert_capture_kept(run, 2)
    assert all(t.meta.outcome == "fail_closed" and "evaluator_error" in t.meta.fail_closed_reasons for t in run.traces)


def test_proxy_down_is_an_error_at_register(tmp_path: Path) -> None:
    admin = ProxyAdmin("http://127.0.0.1:9", "x", timeout_s=2)
    run = run_session(plan_for(tmp_path, "fix"), admin=admin, proxy_url="http://127.0.0.1:9", session_root=tmp_path / "s")
    assert (run.result.status, run.result.stage) == ("error", "register")
    # sealed all the same (tracefleet.contract.semantics), so its GRPO group stays whole: one row without tokens
    (row,) = run.traces
    assert row.num_tokens == 0 and row.meta.outcome == "fail_closed" and row.meta.reward == 0.0
    assert row.meta.fail_closed_reasons == ["session_error:register", "evaluator_missing", "no_trainable_calls"]
    assert (row.meta.group_id, row.meta.task_id, row.meta.sample_index) == ("t/calc", "calc", 0)


# Two calls at once (one streamed), never answered before the session's timeout kills the harness.
IN_FLIGHT_HARNESS = textwrap.dedent(
    """
    import json, os, threading, time, urllib.request
    def call(stream):
        req = urllib.request.Request(
            os.environ["OPENAI_BASE_URL"] + "/chat/completions",
            data=json.dumps({"model": os.environ["OPENAI_MODEL"], "stream": stream,
                             "messages": [{"role": "user", "content": "write a lot"}]}).encode(),
            headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=600).read()
    for stream in (False, True):
        threading.Thread(target=call, args=(stream,)).start()
    time.sleep(600)
    """
)


@pytest.mark.parametrize("netns", [False, True], ids=["host", "netns"])
def test_timeout_with_calls_in_flight_records_and_cancels_them(scripted_engine: Any, proxy: InProcessProxy,
                                                               tmp_path: Path, netns: bool) -> None:
    scripted_engine.configure(token_delay_s=0.05, no_tools_text=" ".join(f"word{i}" for i in range(200)))
    plan = plan_for(tmp_path, "hang", timeout_s=3)
    (tmp_path / "in_flight.py").write_text(IN_FLIGHT_HARNESS)
    harness = plan.harness.model_copy(update={"command": [sys.executable, str(tmp_path / "in_flight.py")]})
    bridge = None
    if netns:
        bridge = UnixToTcpBridge(tmp_path / "proxy.sock", "127.0.0.1", proxy.port).start()
        harness = harness.model_copy(update={"netns": True, "bridge_socket": str(tmp_path / "proxy.sock")})
    try:
        run = go(plan.model_copy(update={"harness": harness}), proxy, tmp_path)
    finally:
        if bridge is not None:
            bridge.close()
    r = run.result
    assert (r.status, r.stage) == ("timeout", "harness")
    assert (r.calls, r.call_errors, r.abandoned_calls) == (2, 2, 2)
    recs = read_capture_log(r.capture_path).records
    assert sorted(rec.stream for rec in recs) == [False, True]
    assert {rec.error.kind for rec in recs} <= {"client_disconnect", "session_closed"}
    deadline = time.monotonic() + 5
    while scripted_engine.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scripted_engine.running() == 0, "an abandoned call is still generating at the engine"
