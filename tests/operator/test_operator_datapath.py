"""The k8s data path against the real S3 server: session folders → sealer entrypoint → the batch the
operator finds by batch_id (what KWOK cannot run, run here with the same code the pods run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fixtures.pod_reads import pod_inputs
from tracefleet.contract import layout
from fixtures.plans import inline_plans
from tracefleet.bucket import open_bucket
from tracefleet.operator import bucketio
from tracefleet.operator.names import POD_PROGRAMS
from tracefleet.contract.podenv import EvaluatorEnv, SealerEnv
from tracefleet.contract.session import SessionResult, Verdict
from tracefleet.runner.pod import sealer_job as pod_seal
from tracefleet.runner.pod.evaluator_job import evaluate_session
from tracefleet.traces.reader import BatchReader
from tracefleet.traces.synthetic import SyntheticSession


def write_session(bucket, job: str, s: int, tmp: Path, reward: float | None, turns: int = 2) -> None:
    path = tmp / f"{job}-s{s}.jsonl"
    sess = SyntheticSession(path, f"{job}-s{s}", seed=s)
    call = sess.call(sess.tokens(20))
    for _ in range(turns - 1):
        call = sess.call(sess.extend(call, sess.tokens(5)), parent=call)
    sess.close()
    bucket.put(layout.capture_key(job, s), path.read_bytes())
    if reward is not None:
        bucket.put(layout.reward_key(job, s), json.dumps({"reward": reward, "status": "ok"}).encode())


def test_sealer_entrypoint_seals_once_and_operator_finds_batch(s3, tmp_path: Path) -> None:
    name = s3.create_bucket()
    uri = f"s3://{name}/runs"
    bucket = open_bucket(uri, **s3.bucket_options())
    job = "demo"
    plan = inline_plans(job, ["t0", "t1"], 2)
    for s in range(4):
        write_session(bucket, job, s, tmp_path, reward=float(s % 2))
    creds = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key, "AWS_ENDPOINT_URL": s3.endpoint}

    # the pod's entrypoint, as the sealer Job runs it (the environment children.jobs.sealer_job writes)
    sealer_env = SealerEnv(bucket=uri, job=job, batch_seq=1, sessions=[0, 1], plans=plan[:2])
    env = {**s3.env(), **pod_inputs(sealer_env, tmp_path / "plan"), "PATH": "/usr/bin:/bin", "TRACEFLEET_SPOOL": str(tmp_path / "spool")}
    r = subprocess.run([sys.executable, "-m", POD_PROGRAMS, "seal"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout.strip().splitlines()[-1])
    assert first["batch_id"] == "k8s-000001" and first["traces"] == 2 and first["sessions"] == 2

    found = bucketio.find_batch(uri, job, "k8s-000001", set(), creds)
    assert found is not None and found.traces == 2 and found.seq == first["seq"] and found.batch_id == "k8s-000001"
    assert found.uri == f"{uri}/{job}/batches/{first['seq']:06d}/"
    assert found.mean_reward == 0.5 and found.to_wire()["meanReward"] == 0.5  # camelCase on the wire (annotation, webhook)
    assert bucketio.find_batch(uri, job, "k8s-000002", set(), creds) is None
    # what a trainer reads: the group's two samples, rewards 0 and 1, give opposite advantages
    batch = BatchReader(bucket, job).read(first["seq"])
    assert batch.table.column("group_id").to_pylist() == ["demo/t0", "demo/t0"]
    assert batch.table.column("task_id").to_pylist() == ["t0", "t0"]
    assert batch.table.column("sample_index").to_pylist() == [0, 1]
    assert [round(float(a), 3) for a in batch.advantages()] == [-1.0, 1.0]

    # a rerun of the same Job (lost completion) finds its batch instead of sealing it twice
    again = pod_seal.seal(bucket, 1, plan[:2])
    assert again["seq"] == first["seq"]
    second = pod_seal.seal(bucket, 2, plan[2:])
    assert second["seq"] == first["seq"] + 1
    # what the operator's retry rule reads: did a session's (last) attempt make a model call?
    bucket.put(layout.capture_key(job, 5), b"")  # an attempt that failed before its first call
    assert [bucketio.session_made_calls(uri, job, s, creds) for s in (0, 5, 6)] == [True, False, False]
    found2 = bucketio.find_batch(uri, job, "k8s-000002", {found.seq}, creds)
    assert found2 is not None and found2.seq == second["seq"]


def test_evaluator_entrypoint_judges_with_the_command_evaluator(s3, tmp_path: Path) -> None:
    """The evaluator Job judges through the runner's `command` evaluator, the one reader of a command's result: its
    JSON reward, or exit 75 (EVALUATOR_UNAVAILABLE_EXIT_CODE) for a judge that could not judge."""
    uri = f"s3://{s3.create_bucket()}"
    bucket = open_bucket(uri, **s3.bucket_options())
    patch = "diff --git a/answer.txt b/answer.txt\nnew file mode 100644\n--- /dev/null\n+++ b/answer.txt\n@@ -0,0 +1 @@\n+42\n"
    judge = ("import json, pathlib, sys\nanswer = pathlib.Path('answer.txt')\n"
             "if not answer.exists(): sys.exit(75)\nprint(json.dumps({'reward': 0.25}))")
    plans = inline_plans("j", ["t"], 4, evaluator={"command": [sys.executable, "-c", judge], "timeoutSeconds": 60})
    for session, diff in ((3, patch), (2, "")):
        plan = plans[session]
        prefix = layout.artifacts_prefix("j", session)
        bucket.put(prefix + layout.PATCH, diff.encode())
        bucket.put(prefix + layout.RESULT, SessionResult.for_plan(plan).model_dump_json().encode())
        out, code = evaluate_session(bucket, EvaluatorEnv(bucket=uri, plan=plan))
        verdict = Verdict.model_validate_json(bucket.get(layout.reward_key("j", session)))
        assert (out.reward, out.status, code) == ((0.25, "ok", 0) if diff else (0.0, "unavailable", 0)), out
        assert (verdict.reward, verdict.status, verdict.evaluator, verdict.task_id) == (out.reward, out.status, "command", "t")
