"""Every built-in diagnostic on a session that shows its problem and on a clean one, from evidence built
by the one builder (`session_evidence`) out of small fixtures: a real `git diff` text, capture records
written by the capture writer, evaluator outcomes as the runner's evaluators return them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tracefleet.contract.job import DiagnosticSpec
from tracefleet.contract.capture import CaptureRecord, CaptureWriter, SpliceInfo, Timings
from tracefleet.diagnostics.evidence import HarnessEvidence, SessionEvidence, session_evidence
from tracefleet.diagnostics.library import BUILTINS
from tracefleet.diagnostics.registry import DIAGNOSTIC_PARAMS_ENV, run_diagnostics
from tracefleet.runner.evaluators import EvalOutcome
from tracefleet.runner.task import Task

TASK = Task(id="calc", prompt="fix add", files={"calc.py": "", "test_calc.py": ""})

FIX = """diff --git a/calc.py b/calc.py
index 1111111..2222222 100644
--- a/calc.py
+++ b/calc.py
@@ -1,3 +1,3 @@
 def add(a, b):
     \"\"\"Return the sum of a and b.\"\"\"
-    return a - b
+    return a + b
"""


def _diff(path: str, added: list[str], *, new: bool = False, context: str = "x = 0") -> str:
    head = f"diff --git a/{path} b/{path}\n" + ("new file mode 100644\n--- /dev/null\n" if new else f"index 1..2 100644\n--- a/{path}\n")
    body = "".join(f"+{line}\n" for line in added)
    if new:
        return head + f"+++ b/{path}\n@@ -0,0 +1,{len(added)} @@\n" + body
    return head + f"+++ b/{path}\n@@ -1,1 +1,{len(added) + 1} @@\n {context}\n" + body


def _record(i: int, *, tool_calls: list[dict[str, Any]] | None = None, **kw: Any) -> CaptureRecord:
    return CaptureRecord(call_id=f"c{i}", session_id="s", dialect="openai-chat", timings=Timings(received_at=1.0 + i),
                         prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=[-0.1, -0.2], finish_reason=kw.pop("finish_reason", "stop"),
                         output_text="ok", tool_calls=tool_calls or [], **kw)


def evidence(tmp_path: Path, *, patch: str = FIX, reward: float | None = 1.0, records: list[CaptureRecord] | None = None,
             harness: HarnessEvidence | None = None, policy_version: int | None = None) -> SessionEvidence:
    capture = tmp_path / "capture.jsonl"
    capture.unlink(missing_ok=True)  # one session's log per call
    with CaptureWriter(capture) as w:
        for r in records if records is not None else [_record(0)]:
            w.append(r)
    return session_evidence(job="j", session_id="s", task=TASK, group_id="j/calc", sample_index=0, capture=capture, patch=patch,
                            harness=harness or HarnessEvidence(preset="command", exit_code=0),
                            evaluation=None if reward is None else EvalOutcome(reward=reward, details={"output_tail": "2 passed"}),
                            timings={"harness": 1.5}, policy_version=policy_version)


def findings(name: str, ev: SessionEvidence, **params: Any) -> list[Any]:
    return BUILTINS[name].run(ev, params, "flag")


def test_evidence_holds_calls_diff_evaluator_harness_and_task(tmp_path: Path) -> None:
    ev = evidence(tmp_path, records=[_record(0, tool_calls=[{"name": "write", "arguments": "{}"}], policy_version=3)])
    assert [c.call_id for c in ev.calls] == ["c0"] and ev.calls[0].tool_calls[0]["name"] == "write"
    assert ev.calls[0].policy_version == 3 and ev.calls[0].finish_reason == "stop"
    assert [(f.path, f.change, [a.line for a in f.added]) for f in ev.files] == [("calc.py", "modified", [3])]
    assert ev.evaluator.reward == 1.0 and ev.evaluator.output_tail == "2 passed" and ev.task["id"] == "calc"
    assert SessionEvidence.model_validate_json(ev.model_dump_json()) == ev  # what the evaluator Job writes, the sealer reads


def test_clean_session_has_no_findings(tmp_path: Path) -> None:
    result = run_diagnostics(evidence(tmp_path))
    assert result.findings == [] and result.action is None and not result.quarantined


@pytest.mark.parametrize("patch, change", [
    (_diff("test_calc.py", ["def test_add(): pass"]), "edited"),
    ("diff --git a/test_calc.py b/test_calc.py\ndeleted file mode 100644\n--- a/test_calc.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n", "deleted"),
    ("diff --git a/test_calc.py b/t.txt\nsimilarity index 100%\nrename from test_calc.py\nrename to t.txt\n", "renamed"),
    (_diff("spec/data.json", ["{}"]), "edited"),  # the task's own protected path (params)
])
def test_protected_files(tmp_path: Path, patch: str, change: str) -> None:
    hits = findings("protected_files", evidence(tmp_path, patch=FIX + patch), protected=["spec/"])
    assert len(hits) == 1 and change in hits[0].message and hits[0].file and hits[0].severity == "error"
    assert findings("protected_files", evidence(tmp_path, patch=FIX + _diff("tests/test_new.py", ["def test(): pass"], new=True))) == []


@pytest.mark.parametrize("patch, line", [
    (_diff("test_calc.py", ["import pytest", "pytestmark = pytest.mark.skip"]), 3),
    (_diff("test_calc.py", ["@pytest.mark.xfail"]), 2),
    (_diff("test_calc.py", ["@unittest.skip('later')"]), 2),
    (_diff("conftest.py", ["collect_ignore = ['test_calc.py']"], new=True), 1),
    (_diff("pytest.ini", ["addopts = -k 'not test_add'"]), 2),
    (_diff("pytest.ini", ["addopts = --deselect test_calc.py::test_add"]), 2),
])
def test_test_skipping(tmp_path: Path, patch: str, line: int) -> None:
    hits = findings("test_skipping", evidence(tmp_path, patch=FIX + patch))
    assert hits and hits[0].line == line and hits[0].file in ("test_calc.py", "conftest.py", "pytest.ini")
    assert findings("test_skipping", evidence(tmp_path)) == []


@pytest.mark.parametrize("patch", [
    _diff("calc.py", ["import sys", "sys.exit(0)"]),
    _diff("calc.py", ["import os; os._exit(0)"]),
    _diff("calc.py", ["import pytest", "pytest.main = lambda *a, **k: 0"]),
    _diff("sitecustomize.py", ["import unittest", "unittest.TestCase.run = lambda self, r=None: None"], new=True),
])
def test_runner_bypass(tmp_path: Path, patch: str) -> None:
    hits = findings("runner_bypass", evidence(tmp_path, patch=patch))
    assert hits and hits[0].line is not None
    assert findings("runner_bypass", evidence(tmp_path, patch=FIX + _diff("calc.py", ["# we never sys.exit(0) here"]))) == []


def test_success_without_work(tmp_path: Path) -> None:
    hits = findings("success_without_work", evidence(tmp_path, patch=""))
    assert len(hits) == 1 and hits[0].call_id == "c0" and "empty workspace diff" in hits[0].message
    assert findings("success_without_work", evidence(tmp_path, patch="", reward=0.0)) == []
    assert findings("success_without_work", evidence(tmp_path)) == []


def _call(name: str, args: Any, **extra: Any) -> dict[str, Any]:
    """A tool call as the proxy records it: JSON-text arguments (a custom tool: its raw input)."""
    return {"id": f"call_{name}", "name": name, "arguments": args if isinstance(args, str) else json.dumps(args), **extra}


PLANTED_FIX = "sed -i 's/return a - b/return a + b/' calc.py"
# Tool calls that only read, in the harnesses' own names and argument shapes.
READS = {
    "claude-code": [_call("Read", {"file_path": "/w/calc.py"}), _call("Bash", {"command": "cat calc.py | head -20", "description": "show"}),
                    _call("Grep", {"pattern": "def add"}), _call("Bash", {"command": "python -m pytest -q 2>&1 | tail -5"})],
    "codex": [_call("exec_command", {"cmd": "git diff && git status --short"}), _call("update_plan", {"plan": []}),
              _call("shell", {"command": ["bash", "-lc", "rg -n 'return a' . ; pytest -q test_calc.py"], "workdir": "/w"})],
    "gemini/qwen": [_call("read_file", {"absolute_path": "/w/calc.py"}), _call("list_directory", {"path": "/w"}),
                    _call("run_shell_command", {"command": "cd /w && ls -la && python3 -m pytest -q", "description": "tests"})],
    "opencode/pi": [_call("glob", {"pattern": "**/*.py"}), _call("bash", {"command": "find . -name '*.py' -not -path './.git/*'"}),
                    _call("read", {"path": "calc.py"}), _call("bash", {"command": "sed -n '1,20p' calc.py; wc -l calc.py"})],
    "openai/anthropic shapes": [{"function": {"name": "bash", "arguments": json.dumps({"command": "grep -rn add ."})}},
                                {"name": "Grep", "input": {"pattern": "add"}}, {"name": "read_file", "args": {"path": "calc.py"}}],
}
# Calls that may change the workspace: the planted fix through each harness's shell, edit tools, writing commands.
CHANGES = {
    "Bash sed -i": _call("Bash", {"command": PLANTED_FIX}),
    "exec_command sed -i": _call("exec_command", {"cmd": PLANTED_FIX}),
    "codex shell argv": _call("shell", {"command": ["bash", "-lc", PLANTED_FIX]}),
    "run_shell_command": _call("run_shell_command", {"command": PLANTED_FIX, "description": "fix"}),
    "bash": _call("bash", {"command": PLANTED_FIX}),
    "Edit": _call("Edit", {"file_path": "calc.py", "old_string": "a - b", "new_string": "a + b"}),
    "MultiEdit": _call("MultiEdit", {"file_path": "calc.py", "edits": []}),
    "Write": _call("Write", {"file_path": "calc.py", "content": "x"}),
    "write_file": _call("write_file", {"file_path": "calc.py", "content": "x"}),
    "replace": _call("replace", {"file_path": "calc.py", "old_string": "-", "new_string": "+"}),
    "opencode edit": _call("edit", {"filePath": "calc.py", "oldString": "-", "newString": "+"}),
    "apply_patch (custom)": _call("apply_patch", "*** Begin Patch\n*** Update File: calc.py\n", kind="custom"),
    "redirect": _call("bash", {"command": "echo 'def add(a, b): return a + b' > calc.py"}),
    "append": _call("bash", {"command": "cat fix.txt >> calc.py"}),
    "tee": _call("bash", {"command": "echo x | tee calc.py"}),
    "find -delete": _call("bash", {"command": "find . -name '*.orig' -delete"}),
    "python -c": _call("bash", {"command": "python -c \"open('calc.py','w').write('')\""}),
    "substitution": _call("bash", {"command": "cat $(cp fix.py calc.py)"}),
    "second line": _call("bash", {"command": "ls\ncp fix.py calc.py"}),
    "git checkout": _call("bash", {"command": "git checkout fixed -- calc.py"}),
    "unquoted-unparsed": _call("bash", {"command": "cat 'calc.py"}),
    "unknown tool": _call("mystery", {"path": "calc.py"}),
    "shell without a command": _call("bash", {"cwd": "/w"}),
}


@pytest.mark.parametrize("calls", READS.values(), ids=READS.keys())
def test_success_without_work_flags_a_diff_no_tool_call_could_have_made(tmp_path: Path, calls: list[dict[str, Any]]) -> None:
    records = [_record(i, tool_calls=[c]) for i, c in enumerate(calls)] + [_record(len(calls))]
    (hit,) = findings("success_without_work", evidence(tmp_path, records=records))
    assert hit.file == "calc.py" and hit.line == 3 and hit.call_id == f"c{len(calls)}" and "came from elsewhere" in hit.message
    assert findings("success_without_work", evidence(tmp_path, records=records, reward=0.0)) == []


@pytest.mark.parametrize("call", CHANGES.values(), ids=CHANGES.keys())
def test_success_without_work_is_silent_when_a_tool_call_may_have_changed_the_workspace(tmp_path: Path, call: dict[str, Any]) -> None:
    records = [_record(i, tool_calls=[c]) for i, c in enumerate([*READS["claude-code"], call])]
    assert findings("success_without_work", evidence(tmp_path, records=records)) == []


def test_success_without_work_judges_only_what_it_can_read(tmp_path: Path) -> None:
    # no tool call at all (a harness may apply edits from the model's text): only when asked to
    assert findings("success_without_work", evidence(tmp_path)) == []
    assert [h.file for h in findings("success_without_work", evidence(tmp_path), without_tool_calls=True)] == ["calc.py"]
    # an unparsed tool call may have been the edit
    unparsed = [_record(0, tool_calls=READS["codex"][:1]), _record(1, tool_parse_errors=["unterminated <tool_call>"])]
    assert findings("success_without_work", evidence(tmp_path, records=unparsed)) == []
    # a torn capture may have lost it
    ev = evidence(tmp_path, records=[_record(0, tool_calls=READS["codex"][:1])])
    assert findings("success_without_work", ev.model_copy(update={"capture_torn": True})) == []


def test_failure_rewarded(tmp_path: Path) -> None:
    crashed = HarnessEvidence(preset="command", exit_code=3, status="error", stderr_tail="Traceback\nKeyError: 'x'")
    assert "KeyError" in findings("failure_rewarded", evidence(tmp_path, harness=crashed))[0].message
    cut = [_record(0, finish_reason="length"), _record(1, tool_parse_errors=["unterminated <tool_call>"])]
    assert [h.call_id for h in findings("failure_rewarded", evidence(tmp_path, records=cut))] == ["c0", "c1"]
    assert findings("failure_rewarded", evidence(tmp_path, records=cut, reward=0.0)) == []
    assert findings("failure_rewarded", evidence(tmp_path)) == []


def test_tool_loop(tmp_path: Path) -> None:
    same = {"name": "read", "arguments": json.dumps({"path": "calc.py"})}
    loop = [_record(i, tool_calls=[same]) for i in range(5)]
    hits = findings("tool_loop", evidence(tmp_path, records=loop), repeats=5)
    assert [h.call_id for h in hits] == ["c4"]
    varied = [_record(i, tool_calls=[{"name": "read", "arguments": json.dumps({"path": f"f{i}"})}]) for i in range(5)]
    assert findings("tool_loop", evidence(tmp_path, records=varied), repeats=5) == []


CODE = (Path(__file__).resolve().parents[2] / "diagnostics" / "evidence.py").read_text()
SUMMARY = (
    "I fixed the bug in add: it returned a - b instead of a + b. The failing test was test_add in test_calc.py, which "
    "expects add(2, 3) to be 5; with the subtraction it got -1. I read calc.py, changed the return statement with sed, "
    "and left the signature and the docstring as they were. Then I ran the whole suite with python -m pytest -q: "
    "both tests pass now, test_add, which failed before, and test_mul, which passed before and still does. I did not "
    "touch the tests, the pytest configuration or any other file, so the diff is the one line in calc.py. Two things "
    "you may want to look at later, though neither is needed for this fix: mul has no test for negative numbers, and "
    "the module has no type hints, which a checker such as mypy would need to say anything useful about callers. If "
    "you want, I can add a parametrized test that covers zero, negative and large values for both functions, and the "
    "hints, in a separate change so this one stays easy to review. The full output of the last test run was two "
    "passed in a few hundredths of a second, with no warnings. Nothing else in the repository refers to add, so no "
    "caller depended on the wrong result; I checked with grep before and after the change to be sure of that.\n\n"
    "Summary of the change:\n- calc.py: `return a - b` became `return a + b` in add.\n- Tests: 2 passed (test_add, "
    "test_mul).\n- Not changed: test_calc.py, conftest.py, pytest.ini, setup.cfg.\nHow I verified it: I ran the failing "
    "test alone first to see the assertion (assert -1 == 5), applied the fix, ran it alone again, then ran everything. "
    "I also tried add with a few more pairs in a Python shell (0 and 0, -2 and 7, 10**9 and 1) and got the sums I "
    "expected. Let me know if you would like the extra tests now."
)
LOOP = "I will run the tests again to check that they pass."


def _words(n: int, seed: str = "w") -> str:
    return " ".join(f"{seed}{i}" for i in range(n))


# (what the model wrote: text, tool calls, finish reason) -> whether runaway_output flags it
RUNAWAY = {
    "a sentence looping": (dict(text=" ".join([LOOP] * 60)), True),
    "one word looping": (dict(text="the " * 400), True),
    "a line looping in a written file": (dict(tool_calls=[_call("Write", {"file_path": "x.py", "content": "print('x')\n" * 300})]), True),
    "half useful, half loop, cut at the limit": (dict(text=_words(300) + " " + " ".join([LOOP] * 30), finish_reason="length"), True),
}
CLEAN_TEXT = {  # each over min_tokens (256 words) but the short loop
    "a summary": (dict(text=SUMMARY), False),
    "the same, cut at the limit": (dict(text=SUMMARY, finish_reason="length"), False),
    "code written by a tool call, cut at the limit": (dict(tool_calls=[_call("Write", {"file_path": "e.py", "content": CODE})],
                                                             finish_reason="length"), False),
    "a JSON tool call with code": (dict(text="Rewriting the module.", tool_calls=[_call("MultiEdit", {"file_path": "e.py", "edits": [
        {"old_string": line, "new_string": line.replace("e", "E")} for line in CODE.splitlines() if line.strip()]})]), False),
    "half useful, half loop, not cut": (dict(text=_words(300) + " " + " ".join([LOOP] * 30)), False),
    "a short loop": (dict(text=" ".join([LOOP] * 15)), False),  # 165 words: under min_tokens
}


@pytest.mark.parametrize("wrote, flagged", [*RUNAWAY.values(), *CLEAN_TEXT.values()], ids=[*RUNAWAY, *CLEAN_TEXT])
def test_runaway_output_repetition(tmp_path: Path, wrote: dict[str, Any], flagged: bool) -> None:
    record = _record(1, tool_calls=wrote.get("tool_calls"), finish_reason=wrote.get("finish_reason", "stop"))
    record.output_text = wrote.get("text")
    hits = findings("runaway_output", evidence(tmp_path, records=[_record(0), record]))
    assert [h.call_id for h in hits] == (["c1"] if flagged else [])
    assert all(h.severity == "warning" and "runaway output" in h.message for h in hits)


def test_runaway_output_session_tokens(tmp_path: Path) -> None:
    records = [_record(i, completion_tokens=100_000) for i in range(4)]
    (hit,) = findings("runaway_output", evidence(tmp_path, records=records))
    assert hit.call_id == "c2" and "300000 tokens" in hit.message and "max_session_tokens 250000" in hit.message
    assert findings("runaway_output", evidence(tmp_path, records=records), max_session_tokens=0) == []
    assert findings("runaway_output", evidence(tmp_path, records=records[:2])) == []


def test_off_policy(tmp_path: Path) -> None:
    records = [_record(0, policy_version=1), _record(1, policy_version=4), _record(2, policy_version=4, splice=SpliceInfo(drift=True))]
    hits = findings("off_policy", evidence(tmp_path, records=records, policy_version=4), max_lag=1, drift=True)
    assert [(h.call_id, "drift" in h.message) for h in hits] == [("c0", False), ("c2", True)]
    fresh = [_record(0, policy_version=4), _record(1, policy_version=4)]
    assert findings("off_policy", evidence(tmp_path, records=fresh, policy_version=4), max_lag=1) == []


def hook_without_calls(ev: SessionEvidence, params: dict[str, Any]) -> list[dict[str, Any]]:
    """A user diagnostic (module:function): flags sessions with fewer calls than params['min_calls']."""
    if len(ev.calls) < params["min_calls"]:
        return [{"message": f"{len(ev.calls)} calls", "file": "session.patch"}]
    return []


hook_without_calls.version = "2"  # type: ignore[attr-defined]


def test_user_hook_and_command_and_actions(tmp_path: Path) -> None:
    ev = evidence(tmp_path)
    script = tmp_path / "diag.py"
    script.write_text("import json, os, sys\nev = json.load(sys.stdin)\np = json.loads(os.environ['" + DIAGNOSTIC_PARAMS_ENV + "'])\n"
                      "print(json.dumps([{'message': 'reward ' + str(ev['evaluator']['reward']), 'call_id': ev['calls'][0]['call_id']}]"
                      " if p['on'] else []))\n")
    specs = [
        DiagnosticSpec(name="few_calls", hook=f"{__name__}:hook_without_calls", action="quarantine", params={"min_calls": 2}),
        DiagnosticSpec(name="cmd", command=[sys.executable, str(script)], params={"on": True}),
        DiagnosticSpec(name="broken", command=[sys.executable, "-c", "raise SystemExit(4)"], action="drop"),
    ]
    result = run_diagnostics(ev, specs)
    by = {f.name: f for f in result.findings}
    assert by["few_calls"].version == "2" and by["few_calls"].action == "quarantine"
    assert by["cmd"].message == "reward 1.0" and by["cmd"].call_id == "c0" and by["cmd"].version == "user"
    assert by["broken"].severity == "error" and "exited 4" in by["broken"].message  # cannot judge: not a pass
    assert result.action == "drop" and result.quarantined
    assert run_diagnostics(ev, specs[:2]).action == "quarantine"
    assert run_diagnostics(ev, []).findings == []  # a job that lists none runs none


RECORDED = sorted((Path(__file__).resolve().parents[1] / "traces" / "data").glob("recorded-*.jsonl"))


@pytest.mark.parametrize("capture", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_real_harness_sessions_with_a_real_fix_have_no_findings(capture: Path) -> None:
    """The six real harnesses' recorded sessions (their own tool-call shapes, auxiliary calls, finish
    reasons) with a reward earned by a fix: every built-in stays silent."""
    ev = session_evidence(job="j", session_id="s", task=TASK, group_id="j/calc", sample_index=0, capture=capture, patch=FIX,
                          harness=HarnessEvidence(exit_code=0), evaluation=EvalOutcome(reward=1.0))
    assert any(c.tool_calls for c in ev.calls)
    assert run_diagnostics(ev).findings == []


def _replayed(capture: Path, tmp_path: Path, commands: list[str]) -> Path:
    """The recorded session with its two shell commands replaced (same harness, tool name and argument shape)."""
    out = tmp_path / capture.name
    lines = capture.read_text().splitlines()
    for old, new in zip(["echo tracefleet-round-1 > note.txt", "echo tracefleet-round-2 >> note.txt"], commands):
        lines = [line.replace(json.dumps(json.dumps(old))[1:-1], json.dumps(json.dumps(new))[1:-1]) for line in lines]
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.mark.parametrize("capture", RECORDED, ids=[p.stem for p in RECORDED])
def test_real_harness_tool_calls_planted_clean_fix_and_reads_only(capture: Path, tmp_path: Path) -> None:
    """The real harnesses' tool calls with the planted clean session's commands (fix with sed -i, run the
    tests): no built-in finds anything. With only reads and a test run, the fix diff came from elsewhere."""
    def run(commands: list[str]) -> list[Any]:
        replayed = _replayed(capture, tmp_path, commands)
        ev = session_evidence(job="j", session_id="s", task=TASK, group_id="j/calc", sample_index=0, capture=replayed, patch=FIX,
                              harness=HarnessEvidence(exit_code=0), evaluation=EvalOutcome(reward=1.0))
        assert sum(len(c.tool_calls) for c in ev.calls) == 2
        return run_diagnostics(ev).findings

    assert run([PLANTED_FIX, "python -m pytest -q"]) == []
    assert [f.name for f in run(["cat calc.py", "python -m pytest -q"])] == ["success_without_work"]


def test_spec_names_a_built_in_unless_it_gives_a_hook_or_command_and_unreadable_evidence_is_not_clean() -> None:
    from pydantic import ValidationError

    from tracefleet.diagnostics.registry import UNAVAILABLE, configured, unavailable

    with pytest.raises(ValidationError, match="name must be a built-in diagnostic"):
        DiagnosticSpec(name="protected_file")
    with pytest.raises(ValidationError, match="at most one of hook or command"):
        DiagnosticSpec(name="x", hook="m:f", command=["true"])
    assert DiagnosticSpec(name="mine", hook="my_checks:f").action == "flag"
    resolved = configured([DiagnosticSpec(name="tool_loop"), DiagnosticSpec(name="protected_files", action="quarantine")])
    (finding,) = unavailable("evidence: ValueError: bad json", resolved).findings
    assert (finding.name, finding.action, finding.severity) == (UNAVAILABLE, "quarantine", "error")
    assert unavailable("x", configured([])).findings == []
