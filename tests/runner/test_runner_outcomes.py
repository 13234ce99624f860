"""An evaluator that cannot run for one sample of a group, through `tracefleet run` (local mode, the scripted
engine, the command harness): the sample is sealed (nothing is lost), marked the infrastructure's, left out of its
group's statistics and the loss as a trainer reads it through BatchReader, and counted in the manifest and the
run's summary; the other samples' advantages are those of the group without it (tracefleet.contract.semantics,
docs/training/outcomes.md). The operator's side of the same job: tests/operator/test_driver_conformance.py.

The evaluator plays a grading service that is down: its first two judgings (one session's, judged twice) exit 75,
its third (the next session's first) too, so that session is judged again and its verdict kept; sessions run one
at a time so the order is fixed.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fixtures.command_harness import MODEL_CALL
from fixtures.local_runs import calc_task, command_job, run_local
from tracefleet.dashboard.source import Source
from tracefleet.traces.advantages import group_advantages
from tracefleet.traces.reader import BatchReader

JOB = "judge-down"
# the k-th session's "agent": the first two fix add (reward 1 when judged), the third does nothing (reward 0)
HARNESS = MODEL_CALL + textwrap.dedent(
    """
    import fcntl, sys
    with open(sys.argv[1], "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        k = len(f.read())
        f.write("x")
    if k < 2:
        src = pathlib.Path("calc.py")
        src.write_text(src.read_text().replace("return a - b", "return a + b"))
    """
)
EVALUATOR = textwrap.dedent(
    """
    import subprocess, sys
    with open(sys.argv[1], "a+") as f:
        f.seek(0)
        k = len(f.read())
        f.write("x")
    if k < 3:
        print("grading service down", file=sys.stderr)
        sys.exit(75)
    sys.exit(subprocess.run([sys.executable, "-m", "pytest", "-q"]).returncode)
    """
)


def judge_down_job(tmp_path: Path) -> dict[str, Any]:
    """The job of 3 samples whose grading service is down for its first (HARNESS, EVALUATOR); its harness counts its
    starts in harness-starts, its evaluator its judgings in judgings."""
    (tmp_path / "harness.py").write_text(HARNESS)
    (tmp_path / "evaluate.py").write_text(EVALUATOR)
    job = command_job(JOB, [calc_task("calc", "fix add")], tmp_path / "out", samples=3, per_batch=3, parallelism=1,
                      evaluator={"preset": "command", "timeoutSeconds": 120,
                                 "command": ["python", str(tmp_path / "evaluate.py"), str(tmp_path / "judgings")]})
    job["spec"]["harness"]["command"] += [str(tmp_path / "harness-starts")]
    return job


def test_an_evaluator_that_cannot_run_leaves_its_sample_out_of_training(scripted_engine: Any, tmp_path: Path) -> None:
    job = judge_down_job(tmp_path)
    done, _ = run_local(job, tmp_path, engine_url=str(scripted_engine.url), timeout_s=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len((tmp_path / "judgings").read_text()) == 5  # 2 + 2 (judged again) + 1

    reader = BatchReader(str(tmp_path / "out"), JOB)
    (seq,) = reader.seqs()
    batch = reader.read(seq)
    rows = {r["session_id"]: r for r in batch.table.to_pylist()}
    down, rejudged, failed = (rows[f"{JOB}-s{i}"] for i in range(3))
    # sealed, marked, reward 0; the evaluator's word and its two judgings are in the row's metadata
    assert (down["outcome_kind"], down["outcome"], down["fail_closed_reasons"], down["reward"]) == (
        "infrastructure", "fail_closed", ["evaluator_unavailable"], 0.0)
    evaluation = json.loads(down["metadata_json"])["extra"]["evaluation"]
    assert (evaluation["status"], evaluation["details"]["attempts"]) == ("unavailable", 2)
    assert evaluation["message"] == "evaluator command could not judge (exit 75): grading service down"
    assert down["num_trainable"] > 0  # the policy's tokens are kept, not trained on
    # judged again, its verdict kept: the policy's own outcome
    assert (rejudged["outcome_kind"], rejudged["reward"]) == ("ok", 1.0)
    assert json.loads(rejudged["metadata_json"])["extra"]["evaluation"]["details"]["attempts"] == 2
    assert (failed["outcome_kind"], failed["reward"]) == ("ok", 0.0)

    # counted: the manifest and the run's summary (status.counters.infrastructure on a cluster)
    assert batch.manifest.outcome_kinds == {"ok": 2, "infrastructure": 1}
    assert "outcomes" in done.stdout and "ok 2, the policy's failures 0, the infrastructure's 1" in done.stdout, done.stdout
    # in the summary's words: the infrastructure's failure, not an error of the session's
    assert ("completed 2, the infrastructure's failures 1 (could not be judged (evaluator unavailable) 1)"
            in done.stdout), done.stdout
    assert "error at evaluate" not in done.stdout + done.stderr
    assert (f"session {JOB}-s0: could not be judged (evaluator unavailable) (the infrastructure's: left out of the group "
            "statistics and the loss): evaluator command could not judge") in done.stdout + done.stderr
    # the summary's learning signal is what the trainer will find: rewards 1 and 0, not 0, 1, 0
    assert "rewards 0..1 (std 0.50); 1 of 1 groups (100%) have non-zero advantages" in done.stdout, done.stdout

    # what a trainer reads: the group without it
    kept = batch.training_table()
    assert kept.column("session_id").to_pylist() == [f"{JOB}-s1", f"{JOB}-s2"]
    without = group_advantages([1.0, 0.0], ["g", "g"], ["s1", "s2"])
    assert without.tolist() == pytest.approx([1.0, -1.0], abs=1e-4)
    sessions = batch.table.column("session_id").to_pylist()
    want = dict(zip([f"{JOB}-s1", f"{JOB}-s2"], without.tolist(), strict=True))
    aligned = [want.get(s, 0.0) for s in sessions]  # one per row of the table, 0 where not trained
    assert batch.advantages().tolist() == pytest.approx(aligned)
    t = batch.tensors()
    assert t["trained"].tolist() == [s in want for s in sessions]
    assert t["sequence_advantages"].tolist() == pytest.approx(aligned)
    # trained on as a reward of 0, it would have pushed the others' advantages
    assert batch.advantages(include_infrastructure=True).tolist() != pytest.approx(aligned, abs=1e-3)


def test_a_rerun_judges_again_what_the_judge_could_not_without_running_the_harness(scripted_engine: Any,
                                                                                     tmp_path: Path) -> None:
    """The same job, its grading service back: `tracefleet run` again on the same output judges s0 again over its
    kept patch (the harness does not start again), its sealed row gets the verdict as a trainer reads it (no second
    row, no new batch), and the summary counts the job's 3 sessions (tracefleet.contract.rejudge)."""
    job = judge_down_job(tmp_path)
    first, _ = run_local(job, tmp_path, engine_url=str(scripted_engine.url), timeout_s=300)
    assert first.returncode == 0, first.stdout + first.stderr
    assert len((tmp_path / "harness-starts").read_text()) == 3
    reader = BatchReader(str(tmp_path / "out"), JOB)
    assert reader.read(0).training_table().column("session_id").to_pylist() == [f"{JOB}-s1", f"{JOB}-s2"]

    again, _ = run_local(job, tmp_path, engine_url=str(scripted_engine.url), timeout_s=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len((tmp_path / "harness-starts").read_text()) == 3  # no harness ran
    assert len((tmp_path / "judgings").read_text()) == 6  # one judging more: s0's, and it judged
    assert (f"judging again 1 sealed session(s) of job {JOB!r} the judge could not judge (1 unavailable); their "
            "harness does not run again") in again.stderr, again.stderr
    assert "re-judged" in again.stdout and "1 sealed session(s) the judge could not judge, judged again without their " \
        "harness: 1 judged" in again.stdout, again.stdout
    # the job's sessions, once each: no attempt counted twice
    assert "judged 3, quarantined 0, dropped 0" in again.stdout, again.stdout
    assert "ok 3, the policy's failures 0, the infrastructure's 0" in again.stdout, again.stdout
    assert "0 run now, 3 already sealed earlier, 3 in the job" in again.stdout, again.stdout

    assert reader.seqs() == [0]  # no batch added
    batch = reader.read(0)
    sessions = batch.table.column("session_id").to_pylist()
    assert sorted(set(sessions)) == [f"{JOB}-s{i}" for i in range(3)] and len(sessions) == len(set(sessions))
    rows = {r["session_id"]: r for r in batch.table.to_pylist()}
    s0 = rows[f"{JOB}-s0"]
    assert (s0["outcome_kind"], s0["outcome"], s0["fail_closed_reasons"], s0["reward"], s0["evaluator_reward"]) == (
        "ok", "ok", [], 1.0, 1.0)
    extra = json.loads(s0["metadata_json"])["extra"]
    assert (extra["evaluation"]["status"], extra["rejudged"]["why"], extra["rejudged"]["before"]["status"]) == (
        "ok", "unavailable", "unavailable")
    # trained on now, with its group: rewards 1, 1, 0
    assert batch.training_table().column("session_id").to_pylist() == [f"{JOB}-s0", f"{JOB}-s1", f"{JOB}-s2"]
    want = group_advantages([1.0, 1.0, 0.0], ["g"] * 3, ["s0", "s1", "s2"]).tolist()
    assert batch.advantages().tolist() == pytest.approx([dict(zip([f"{JOB}-s{i}" for i in range(3)], want))[s]
                                                         for s in sessions])
    assert batch.traces()[sessions.index(f"{JOB}-s0")].meta.reward == 1.0
    # its counts as its rows read now, where manifests are read (`traces ls`, the dashboard)
    assert batch.manifest.outcome_kinds == reader.batches()[0].outcome_kinds == {"ok": 3}
    assert (batch.manifest.reward.fail_closed, batch.manifest.reward.positive) == (0, 2)
    source = Source(str(tmp_path / "out"))  # the dashboard shows the same
    source.refresh()
    shown = source.jobs[JOB]
    assert shown.manifests[0].outcome_kinds == {"ok": 3}
    assert {r["session_id"]: r["outcome_kind"] for r in shown.load_rows(0)}[f"{JOB}-s0"] == "ok"
    # the sealed data itself is as it was
    sealed = BatchReader(str(tmp_path / "out"), JOB, overlays=False).read(0).table.to_pylist()
    assert next(r for r in sealed if r["session_id"] == f"{JOB}-s0")["outcome_kind"] == "infrastructure"

    # judged: a third run has nothing to judge again, and counts the same
    third, _ = run_local(job, tmp_path, engine_url=str(scripted_engine.url), timeout_s=300)
    assert third.returncode == 0 and "judging again" not in third.stderr, third.stderr
    assert "judged 3, quarantined 0, dropped 0" in third.stdout, third.stdout


SLOW_EVALUATOR = textwrap.dedent(
    """
    import subprocess, sys, time
    time.sleep(4)
    sys.exit(subprocess.run([sys.executable, "-m", "pytest", "-q"]).returncode)
    """
)


def test_a_judging_that_timed_out_is_judged_again_only_under_a_changed_evaluator(scripted_engine: Any,
                                                                                 tmp_path: Path) -> None:
    """A judging that timed out is the policy's (the agent's code runs under the judge): a rerun of the same job
    leaves it; once `timeoutSeconds` is raised, a rerun judges it again, without the harness."""
    (tmp_path / "harness.py").write_text(HARNESS)
    (tmp_path / "evaluate.py").write_text(SLOW_EVALUATOR)
    evaluator = {"preset": "command", "timeoutSeconds": 2, "command": ["python", str(tmp_path / "evaluate.py")]}
    job = command_job("judge-slow", [calc_task("calc", "fix add")], tmp_path / "out", samples=1, per_batch=1,
                      evaluator=evaluator)
    job["spec"]["harness"]["command"] += [str(tmp_path / "harness-starts")]
    first, _ = run_local(job, tmp_path, engine_url=str(scripted_engine.url), timeout_s=300)
    # the run's only session did not get through: the run says so (exit 1), its row is sealed
    assert first.returncode == 1 and "evaluator command ran past its limit of 2 s" in first.stdout, first.stdout
    reader = BatchReader(str(tmp_path / "out"), "judge-slow")
    (row,) = reader.read(0).table.to_pylist()
    assert (row["outcome_kind"], row["fail_closed_reasons"]) == ("policy", ["evaluator_timeout"])

    same, _ = run_local(job, tmp_path, engine_url=str(scripted_engine.url), timeout_s=300)
    assert same.returncode == 0 and "judging again" not in same.stderr, same.stderr

    evaluator["timeoutSeconds"] = 60
    changed, _ = run_local(job, tmp_path, engine_url=str(scripted_engine.url), timeout_s=300)
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert "(1 timed out; the evaluator changed)" in changed.stderr, changed.stderr
    assert len((tmp_path / "harness-starts").read_text()) == 1
    (row,) = reader.read(0).table.to_pylist()
    assert (row["outcome_kind"], row["fail_closed_reasons"], row["reward"]) == ("ok", [], 1.0)
