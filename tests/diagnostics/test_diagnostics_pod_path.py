"""The pod path of the diagnostics, with the programs the evaluator and sealer Jobs run over a bucket
(the data path without a cluster): the evaluator Job builds the session's evidence with the local
lifecycle's builder and writes it beside the session; the sealer runs spec.diagnostics (from its
environment, as the operator's sealer_job writes it) over it, so the planted test edit is quarantined
and the reader leaves it out, as in local mode; a session that was never judged still gets evidence
(built by the sealer from the uploads) and its row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fixtures.pod_reads import pod_inputs
from tracefleet.contract import layout
from tracefleet.contract.job import RolloutJob
from fixtures.plans import inline_job
from tracefleet.bucket import LocalBucket
from tracefleet.contract.session import SessionResult
from tracefleet.diagnostics.evidence import SessionEvidence
from tracefleet.contract.podenv import EvaluatorEnv, SealerEnv
from tracefleet.operator.plans import for_sealer, job_plans, job_tasks
from tracefleet.runner.pod import sealer_job as pod_seal
from tracefleet.runner.pod.evaluator_job import evaluate_session
from tracefleet.traces.reader import BatchReader
from tracefleet.traces.synthetic import SyntheticSession

FILES = {"calc.py": "def add(a, b):\n    return a - b\n",
         "test_calc.py": "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"}
HACK = ("diff --git a/test_calc.py b/test_calc.py\n--- a/test_calc.py\n+++ b/test_calc.py\n@@ -1,4 +1,4 @@\n"
        " from calc import add\n \n def test_add():\n-    assert add(2, 3) == 5\n+    assert True\n")
FIX = ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
       "-    return a - b\n+    return a + b\n")


def _upload(bucket: LocalBucket, job: str, session: int, patch: str, tmp: Path, **failed: str) -> None:
    capture = tmp / f"{job}-s{session}.jsonl"
    with SyntheticSession(capture, f"{job}-s{session}", seed=session) as sess:
        sess.call(sess.tokens(20), n_completion=6)
    bucket.put(layout.capture_key(job, session), capture.read_bytes())
    prefix = layout.artifacts_prefix(job, session)
    bucket.put(prefix + layout.PATCH, patch.encode())
    result = SessionResult(session_id=f"{job}-s{session}", job=job, task_id="calc", sample_index=session,
                           group_id=f"{job}/calc", harness="command", harness_exit_code=0, **failed)
    bucket.put(prefix + layout.RESULT, result.model_dump_json().encode())
    bucket.put(prefix + layout.HARNESS_STDERR, b"done\n")


def judged_sessions(tmp_path: Path, monkeypatch) -> tuple[LocalBucket, str, list]:
    """Three sessions of one task uploaded as the harness pods would (a test edit, two fixes), the first
    two judged by the evaluator Job's program; the third never judged."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRACEFLEET_SPOOL", str(tmp_path / "spool"))
    repo = tmp_path / "calc"
    repo.mkdir()
    for name, text in FILES.items():
        (repo / name).write_text(text)
    task = {"id": "calc", "prompt": "fix add", "workspace": {"repo": str(repo)}}
    (tmp_path / "task.json").write_text(json.dumps(task))
    bucket = LocalBucket(tmp_path / "bucket")
    job = "podjob"
    manifest = inline_job(job, [], 3, tasks={"inline": [task], "samplesPerTask": 3},
                          inference={"external": {"baseUrl": "http://e"}, "policyVersion": 4},
                          evaluator={"command": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                                     "timeoutSeconds": 120})
    plan = job_plans(manifest, job_tasks(manifest))
    for session, patch in ((0, HACK), (1, FIX)):
        _upload(bucket, job, session, patch, tmp_path)
    # session 2's harness pod failed after its model call: never judged, the policy's failure (trained on, reward 0)
    _upload(bucket, job, 2, FIX, tmp_path, status="error", stage="harness", error="harness exited 1")
    for session in (0, 1):
        env = EvaluatorEnv.from_env(pod_inputs(EvaluatorEnv(bucket=str(tmp_path / "bucket"), plan=plan[session]),
                                               tmp_path / f"plan-{session}"))
        body, code = evaluate_session(bucket, env)
        assert code == 0 and body.reward == 1.0, body  # unprotected: the hack passes too
    return bucket, job, plan


def test_evaluator_job_builds_evidence_and_the_sealer_quarantines(tmp_path: Path, monkeypatch) -> None:
    bucket, job, plan = judged_sessions(tmp_path, monkeypatch)
    evidence = SessionEvidence.model_validate_json(bucket.get(layout.evidence_key(job, "podjob-s0")))
    assert [(f.path, f.change) for f in evidence.files] == [("test_calc.py", "modified")]
    assert evidence.evaluator.reward == 1.0 and evidence.task["id"] == "calc" and len(evidence.calls) == 1
    # kept as local mode keeps it (what `tracefleet diagnose` reads): the session's group, the job's policy version
    assert evidence.group_id == "podjob/calc" and evidence.policy_version == 4

    # the sealer's environment as the operator writes it from the RolloutJob's spec.diagnostics
    manifest = RolloutJob.model_validate({
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": job},
        "spec": {"inference": {"external": {"baseUrl": "http://e"}}, "harness": {"command": ["true"]},
                 "tasks": {"inline": [json.loads((tmp_path / "task.json").read_text())], "samplesPerTask": 3}, "output": {"uri": "s3://bucket/prefix"},
                 "diagnostics": [{"name": "protected_files", "action": "quarantine"}]}})
    plans = [for_sealer(p) for p in job_plans(manifest, job_tasks(manifest))]
    sealer = SealerEnv.from_env(pod_inputs(SealerEnv(bucket=str(tmp_path / "bucket"), job=job, batch_seq=0,
                                                     sessions=[0, 1, 2], plans=plans), tmp_path / "plans"))
    out = pod_seal.seal(bucket, 0, sealer.plans)
    assert out["quarantined_sessions"] == 1 and out["diagnostics"]["protected_files"]["quarantined"] == 1

    batch = BatchReader(bucket, job).read(out["seq"])
    rows = batch.table.select(["session_id", "quarantined", "reward", "diagnostics"]).to_pylist()
    assert [(r["session_id"], r["quarantined"], r["reward"]) for r in rows] == [
        ("podjob-s0", True, 0.0), ("podjob-s1", False, 1.0), ("podjob-s2", False, 0.0)]
    assert rows[0]["diagnostics"][0]["file"] == "test_calc.py" and rows[2]["diagnostics"] == []
    assert batch.training_table().column("session_id").to_pylist() == ["podjob-s1", "podjob-s2"]


def test_diagnose_backtests_a_job_sealed_without_the_diagnostic(tmp_path: Path, monkeypatch) -> None:
    """Sealed with no diagnostic listed (spec.diagnostics: []), then `tracefleet diagnose` with the built-in
    and with a hook the user just wrote: exactly the planted session, and what quarantining it changes."""
    bucket, job, plan = judged_sessions(tmp_path, monkeypatch)
    pod_seal.seal(bucket, 0, [p.model_copy(update={"diagnostics": []}) for p in plan])
    assert BatchReader(bucket, job).read(0).table.column("quarantined").to_pylist() == [False, False, False]
    (tmp_path / "my_checks.py").write_text(
        "def edits_tests(evidence, params):\n"
        "    return [{'message': 'test edited', 'file': f.path} for f in evidence.files if f.path.startswith('test_')]\n")
    done = subprocess.run([sys.executable, "-m", "tracefleet", "diagnose", str(tmp_path / "bucket"), "--job", job,
                           "--diagnostic", "protected_files", "--diagnostic", "my_checks:edits_tests"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.splitlines()[0] == "job podjob: 3 sealed sessions in 1 batches, 1 without evidence (not judged)", out
    for name in ("protected_files (v1)", "edits_tests (vuser)"):
        block = out[out.index(name):].splitlines()[:6]
        assert block[0] == f"{name}: 1 of 2 sessions flagged", out
        assert block[1] == "  mean reward flagged 1.000 vs not 1.000", out
        # rewards 1 (hack), 1 (fix), 0 (unjudged): the hack's advantage +0.707 is what a trainer promoted;
        # without it the fix goes to +1 and the unjudged session to -1
        assert block[2] == "  positive-advantage sessions demoted: 1 (advantage +0.707 in all)", out
        assert block[3] == "  mean |advantage change| of the other sessions in their groups: 0.354", out
        assert block[4] == "  flagged: podjob-s0", out
