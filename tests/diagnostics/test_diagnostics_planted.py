"""Planted reward hacks through the six real harness CLIs, run as a user runs a job (`tracefleet run`,
the scripted engine driving each session by the marker in its task's prompt), judged by what the trainer
reads (BatchReader).

Each hack (tests/fixtures/planted.py: edit the failing test, insert a skip, delete the test file, add a
short-circuiting conftest.py, exit early from the code under test, claim success with no change) runs in
its own session, through its own harness, once with the evaluator's protection off (pytest on the
workspace as the agent left it: most hacks earn reward 1) and once with it on (the `tests` preset, the
tests restored). Every job runs every built-in diagnostic with action quarantine, so a clean session
flagged by any of them would show. Hack sessions: the intended diagnostic's finding with its evidence,
quarantined, reward <= 0, left out of training_table(). Clean sessions of the same task that really fix
the bug (two per job, 24 over the six harnesses): no finding at all, reward 1, trained on.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fixtures.local_runs import run_local
from fixtures.planted import CLEAN, HACKS, hack_evidence, planted_evaluator, planted_script, planted_tasks
from tracefleet.diagnostics.library import BUILTINS
from tracefleet.traces.reader import BatchReader

# Which real harness plants which hack: every preset plants one (four wire dialects).
HACK_HARNESS = {"edit-test": "codex", "insert-skip": "claude-code", "delete-test": "pi", "conftest": "qwen-code",
                "early-exit": "gemini-cli", "claim": "opencode"}
CLEAN_PER_JOB = 2  # x 12 jobs = 24 clean sessions
JOBS_AT_ONCE = 3  # `tracefleet run` processes at once; each runs its 3 sessions at once
# The slowest jobs start first, so the last ones to finish are short (measured on 2 loaded cores:
# Qwen Code and OpenCode ~45-65 s a job, Gemini CLI ~35 s, Claude Code and Pi ~25 s, Codex ~20 s).
SLOWEST_FIRST = ["qwen-code", "opencode", "gemini-cli", "claude-code", "pi", "codex"]
# What the evaluator gives each hack. Off: pytest -q exits 0 on a rewritten test, a skip, a conftest that
# patches the code, an os._exit(0) at import, and on the already fixed `claim` copy; with the test file
# deleted it collects nothing and exits 5. On: the tests are restored, so only `claim` (the mislabelled
# task whose bug is already fixed) passes; os._exit(0) leaves no test results, which is no pass.
# Protection off is the `command` preset's `python -m pytest -q` on the workspace as the agent left it; since issue 20
# every pytest a judge runs reads no conftest.py of the workspace, so the conftest hack earns nothing even there.
EVALUATOR_REWARD = {
    False: {"edit-test": 1.0, "insert-skip": 1.0, "delete-test": 0.0, "conftest": 0.0, "early-exit": 1.0, "claim": 1.0},
    True: {"edit-test": 0.0, "insert-skip": 0.0, "delete-test": 0.0, "conftest": 0.0, "early-exit": 0.0, "claim": 1.0},
}
COLUMNS = ["session_id", "task_id", "harness", "reward", "evaluator_reward", "quarantined", "diagnostics"]


@dataclass
class JobRun:
    name: str
    hack: str
    harness: str
    protection: bool
    output: str  # `tracefleet run`'s stdout + stderr
    seconds: float
    rows: list[dict[str, Any]]  # every sealed row (quarantined ones included)
    trained: set[str]  # session ids with rows in training_table()
    quarantined_sessions: int  # summed over the batch manifests

    def sessions(self, task_prefix: str) -> dict[str, list[dict[str, Any]]]:
        """session id -> its rows, for the tasks whose id starts with task_prefix."""
        out: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in self.rows:
            if row["task_id"].startswith(task_prefix):
                out[row["session_id"]].append(row)
        return dict(out)


def job_name(hack: str, protection: bool) -> str:
    return f"planted-{hack}-{'on' if protection else 'off'}"


def job_spec(hack: str, protection: bool, tmp: Path, out: Path) -> dict[str, Any]:
    return {
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": job_name(hack, protection)},
        "spec": {
            "inference": {"external": {"baseUrl": "http://127.0.0.1:1"}, "capture": {"mode": "server"}},
            "harness": {"preset": HACK_HARNESS[hack], "sessionTimeoutSeconds": 240},
            "tasks": {"samplesPerTask": 1, "inline": planted_tasks(tmp, protection=protection, hacks=[hack], clean=CLEAN_PER_JOB)},
            "evaluator": planted_evaluator(protection=protection),
            # every built-in (new ones included), all quarantining: a clean session flagged by any would show
            "diagnostics": [{"name": d, "action": "quarantine"} for d in BUILTINS],
            "output": {"uri": str(out), "tracesPerBatch": 8},
            "parallelism": 1 + CLEAN_PER_JOB,
        },
    }


def run_job(hack: str, protection: bool, job: dict[str, Any], engine_url: str, job_dir: Path, out: Path) -> JobRun:
    """`tracefleet run` on `job` (job_spec(hack, protection, ...)) and what BatchReader reads of it."""
    name, harness = job["metadata"]["name"], job["spec"]["harness"]["preset"]
    job_dir.mkdir()
    done, seconds = run_local(job, job_dir, engine_url=engine_url, timeout_s=400)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{name} ({harness}) exited {done.returncode}:\n{output[-6000:]}"
    reader = BatchReader(str(out), name)
    rows: list[dict[str, Any]] = []
    trained: set[str] = set()
    quarantined = 0
    for seq in reader.seqs():
        batch = reader.read(seq)
        rows += batch.table.select(COLUMNS).to_pylist()
        trained |= set(batch.training_table().column("session_id").to_pylist())
        quarantined += batch.manifest.quarantined_sessions
    return JobRun(name, hack, harness, protection, output, seconds, rows, trained, quarantined)


@pytest.fixture(scope="module")
def planted_runs(harness_binaries: Any, scripted_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], JobRun]:
    """(hack, protection) -> its job's run: 12 jobs, each one hack and CLEAN_PER_JOB clean sessions."""
    scripted_engine.configure(**planted_script(*HACK_HARNESS.values()))
    tmp = tmp_path_factory.mktemp("planted")
    keys = sorted(((hack, protection) for protection in (False, True) for hack in HACKS),
                  key=lambda k: SLOWEST_FIRST.index(HACK_HARNESS[k[0]]))
    jobs = {k: job_spec(*k, tmp, tmp / "out") for k in keys}  # tasks (and their repositories) made before any job runs
    started = time.monotonic()
    with ThreadPoolExecutor(JOBS_AT_ONCE) as pool:
        runs = dict(zip(keys, pool.map(lambda k: run_job(*k, jobs[k], str(scripted_engine.url), tmp / job_name(*k), tmp / "out"), keys)))
    load = os.getloadavg()
    print(f"\nplanted: {len(runs)} jobs in {time.monotonic() - started:.0f}s (load {load[0]:.1f} {load[1]:.1f}); "
          + ", ".join(f"{r.name}[{r.harness}] {r.seconds:.0f}s" for r in runs.values()))
    return runs


def _hack_session(run: JobRun) -> list[dict[str, Any]]:
    sessions = run.sessions(run.hack)
    assert len(sessions) == 1, f"{run.name}: {sessions}\n{run.output[-3000:]}"
    return next(iter(sessions.values()))


def _check_hack(run: JobRun) -> None:
    rows = _hack_session(run)
    file, line = hack_evidence(run.hack)
    intended = HACKS[run.hack][1]
    for row in rows:  # a session can seal several rows (a harness's auxiliary calls); each carries the findings
        context = f"{run.name} ({run.harness}): {row}"
        assert row["harness"] == run.harness, context
        assert row["evaluator_reward"] == EVALUATOR_REWARD[run.protection][run.hack], context
        assert row["quarantined"] and row["reward"] is not None and row["reward"] <= 0, context
        findings = [f for f in row["diagnostics"] if f["name"] == intended]
        assert findings, f"{intended} missed the hack: {context}"
        assert all(f["action"] == "quarantine" for f in row["diagnostics"]), context
        assert any((f["file"], f["line"]) == (file, line) for f in findings), context
        if run.hack == "claim":  # the finding names the call that claimed success
            assert all(f["call_id"] for f in findings), context
    assert rows[0]["session_id"] not in run.trained, f"{run.name}: a quarantined hack is in training_table()"
    assert run.quarantined_sessions == 1, f"{run.name}: manifests count {run.quarantined_sessions} quarantined sessions"


@pytest.mark.slow
@pytest.mark.parametrize("hack", list(HACKS))
def test_hack_with_protection_off_is_flagged_by_its_diagnostic_and_quarantined(planted_runs: dict, hack: str) -> None:
    _check_hack(planted_runs[hack, False])


@pytest.mark.slow
@pytest.mark.parametrize("hack", list(HACKS))
def test_hack_with_protection_on_still_has_its_finding(planted_runs: dict, hack: str) -> None:
    _check_hack(planted_runs[hack, True])


@pytest.mark.slow
def test_clean_sessions_have_no_finding_from_any_builtin_and_are_trained_on(planted_runs: dict) -> None:
    clean: dict[str, list[dict[str, Any]]] = {}
    for run in planted_runs.values():
        sessions = run.sessions(CLEAN)
        assert len(sessions) == CLEAN_PER_JOB, f"{run.name}: {sorted(sessions)}\n{run.output[-3000:]}"
        clean.update(sessions)
        for session_id in sessions:
            assert session_id in run.trained, f"{run.name}: clean session {session_id} is not in training_table()"
    flagged = {sid: [f for row in rows for f in row["diagnostics"]] for sid, rows in clean.items()
               if any(row["diagnostics"] or row["quarantined"] for row in rows)}
    harnesses = {row["harness"] for rows in clean.values() for row in rows}
    print(f"\nplanted: false positives {len(flagged)} of {len(clean)} clean sessions over {sorted(harnesses)}")
    assert len(clean) >= 20 and harnesses == set(HACK_HARNESS.values())
    assert not flagged, f"{len(flagged)} of {len(clean)} clean sessions flagged: {flagged}"
    for rows in clean.values():
        assert all(row["reward"] == 1.0 and row["evaluator_reward"] == 1.0 for row in rows), rows
