"""Entrypoints of the pods the operator creates (same image): `python -m tracefleet.operator.podmain seal|evaluate`.

Configuration comes from the environment the child builders set (children.py); bucket credentials
come from the job's Secret as AWS_* variables (tracefleet.bucket reads them).

    seal      build traces for the sessions in TRACEFLEET_SESSIONS from their capture logs and
              rewards, and seal them as one batch with batch_id k8s-<TRACEFLEET_BATCH_SEQ>
              (a rerun of the Job finds the same batch instead of sealing twice).
    evaluate  score the session and write reward.json. With a task in the env (TRACEFLEET_TASK_JSON /
              _TASKS_FILE / _TASKS_URI, set by the operator) the runner's evaluators judge it exactly as
              in local mode: the task's workspace is rebuilt, the uploaded session.patch applied to a fresh
              copy, and TRACEFLEET_EVALUATOR picks `tests` (FAIL_TO_PASS / PASS_TO_PASS), `hook`
              (TRACEFLEET_EVALUATOR_ENTRYPOINT) or `command` (TRACEFLEET_COMMAND_JSON). Without a task:
              run TRACEFLEET_COMMAND_JSON in the downloaded artifacts folder (reward 1.0 on exit 0, 0.0
              otherwise; JSON {"reward": x} on stdout wins).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tracefleet.bucket import Bucket, ObjectNotFound, open_bucket

from .bucketio import batch_id_for, session_prefix
from .names import decode_ranges


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"{name} is not set (the operator sets it on the pods it creates)")
    return value


def session_reward(bucket: Bucket, job: str, session: int) -> dict[str, Any]:
    try:
        return json.loads(bucket.get(session_prefix(job, session) + "reward.json"))
    except ObjectNotFound:
        return {"status": "missing"}


def seal(bucket: Bucket, job: str, seq: int, sessions: list[int], builder: str = "prefix-merge") -> dict[str, Any]:
    from tracefleet.traces.build import build_traces
    from tracefleet.traces.schema import SessionInfo
    from tracefleet.traces.seal import Sealer

    traces: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in sessions:
            try:
                data = bucket.get(session_prefix(job, s) + "capture.jsonl")
            except ObjectNotFound:
                continue  # no capture: nothing trainable from this session (fail closed)
            path = Path(tmp) / f"{job}-s{s}.jsonl"
            path.write_bytes(data)
            r = session_reward(bucket, job, s)
            status = r.get("status", "ok") if r.get("status") in ("ok", "error", "timeout", "missing") else "error"
            info = SessionInfo(job=job, session_id=f"{job}-s{s}", reward=r.get("reward"), evaluator_status=status,
                               task_id=r.get("task_id"), sample_index=r.get("sample_index"))
            traces += build_traces(path, builder=builder, session=info).traces
        manifest = Sealer(bucket, job, spool=tmp).seal(traces, batch_id=batch_id_for(seq))
    return manifest.model_dump(mode="json")


def evaluate(bucket: Bucket, job: str, session: int, command: list[str]) -> dict[str, Any]:
    prefix = session_prefix(job, session)
    with tempfile.TemporaryDirectory() as tmp:
        for obj in bucket.list(prefix + "artifacts/"):
            dest = Path(tmp) / obj.key.split("/artifacts/", 1)[1]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(bucket.get(obj.key))
        try:
            proc = subprocess.run(command, cwd=tmp, capture_output=True, text=True,
                                  timeout=float(os.environ.get("TRACEFLEET_TIMEOUT_S", "600")))
            reward = 1.0 if proc.returncode == 0 else 0.0
            try:
                reward = float(json.loads(proc.stdout.strip().splitlines()[-1])["reward"])
            except (ValueError, KeyError, IndexError, TypeError):
                pass
            result = {"reward": reward, "status": "ok", "exit_code": proc.returncode}
        except subprocess.TimeoutExpired:
            result = {"reward": 0.0, "status": "timeout"}
    bucket.put(prefix + "reward.json", json.dumps(result).encode())
    return result


# The RolloutJob's evaluator presets -> the runner's evaluator types.
EVALUATOR_TYPES = {"tests": "tests", "hook": "python", "command": "command"}


def _download(bucket: Bucket, prefix: str, dest: Path) -> int:
    count = 0
    for obj in bucket.list(prefix):
        target = dest / obj.key[len(prefix):]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(bucket.get(obj.key))
        count += 1
    return count


def evaluator_spec_from_env(env: Any) -> Any:
    from tracefleet.runner.evaluators import EvaluatorSpec

    preset = env.get("TRACEFLEET_EVALUATOR") or "command"
    if preset not in EVALUATOR_TYPES:
        raise SystemExit(f"TRACEFLEET_EVALUATOR={preset!r}: expected one of {', '.join(EVALUATOR_TYPES)}")
    command = json.loads(env["TRACEFLEET_COMMAND_JSON"]) if env.get("TRACEFLEET_COMMAND_JSON") else None
    return EvaluatorSpec(type=EVALUATOR_TYPES[preset], command=command, entrypoint=env.get("TRACEFLEET_EVALUATOR_ENTRYPOINT"),
                         timeout_s=float(env.get("TRACEFLEET_TIMEOUT_S") or 600))


def evaluate_session(bucket: Bucket, job: str, session: int, env: Any) -> tuple[dict[str, Any], int]:
    """Judge one session with the runner's evaluators; (reward.json body, exit code). Fails closed:
    missing artifacts, a workspace that cannot be rebuilt or an evaluator error are reward 0."""
    from tracefleet.runner.evaluators import EvalContext, get_evaluator
    from tracefleet.runner.pod import task_from_env
    from tracefleet.runner.workspace import WorkspaceError, prepare_workspace

    from .children.jobs import EVALUATOR_FATAL_EXIT_CODE

    prefix = session_prefix(job, session)
    spec = evaluator_spec_from_env(env)
    task = task_from_env(env)
    result: dict[str, Any] = {"reward": 0.0, "task_id": task.id, "sample_index": int(env.get("TRACEFLEET_SAMPLE_INDEX") or 0),
                              "evaluator": spec.type}
    code = 0
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = Path(tmp) / "artifacts"
        artifacts.mkdir()
        _download(bucket, prefix + "artifacts/", artifacts)
        patch_file = artifacts / "session.patch"
        harness = json.loads((artifacts / "result.json").read_text()) if (artifacts / "result.json").exists() else {}
        if not patch_file.exists():
            result.update(status="error", message=f"no {prefix}artifacts/session.patch: the harness pod uploaded no diff")
            code = EVALUATOR_FATAL_EXIT_CODE  # retrying cannot produce the missing upload
        else:
            session_dir = Path(tmp) / "session"
            try:
                workspace = prepare_workspace(task, session_dir, setup_timeout_s=spec.timeout_s)
            except WorkspaceError as exc:
                result.update(status="error", message=f"rebuilding the task's workspace failed: {exc}")
                code = 1
            else:
                spec.env["TRACEFLEET_ARTIFACTS_DIR"] = str(artifacts)
                ctx = EvalContext(
                    task=task, workspace=workspace, patch=patch_file.read_text(), session_dir=session_dir,
                    harness_exit_code=harness.get("harness_exit_code"), harness_stdout=artifacts / "harness.stdout",
                    metadata={"session_id": f"{job}-s{session}", "sample_index": result["sample_index"]},
                )
                try:
                    outcome = get_evaluator(spec).evaluate(ctx)
                except Exception as exc:  # noqa: BLE001 - evaluators fail closed; this catches their construction
                    result.update(status="error", message=f"{type(exc).__name__}: {exc}")
                else:
                    result.update(reward=outcome.reward if outcome.status == "ok" else 0.0, status=outcome.status,
                                  message=outcome.message, details=outcome.details, duration_s=round(outcome.duration_s, 3))
    bucket.put(prefix + "reward.json", json.dumps(result, default=str).encode())
    return result, code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("seal", "evaluate"):
        print(__doc__)
        return 2
    bucket = open_bucket(_env("TRACEFLEET_BUCKET"))
    job = _env("TRACEFLEET_JOB")
    if argv[0] == "seal":
        out = seal(bucket, job, int(_env("TRACEFLEET_BATCH_SEQ")), decode_ranges(_env("TRACEFLEET_SESSIONS")),
                   os.environ.get("TRACEFLEET_BUILDER", "prefix-merge"))
    elif any(os.environ.get(k) for k in ("TRACEFLEET_TASK_JSON", "TRACEFLEET_TASKS_FILE", "TRACEFLEET_TASKS_URI")):
        out, code = evaluate_session(bucket, job, int(_env("TRACEFLEET_SESSION")), os.environ)
        print(json.dumps(out, default=str))
        return code
    else:
        out = evaluate(bucket, job, int(_env("TRACEFLEET_SESSION")), json.loads(_env("TRACEFLEET_COMMAND_JSON")))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
