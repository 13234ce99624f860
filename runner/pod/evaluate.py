"""The evaluator Job's program: score one finished session and write its reward.json.

`python -m tracefleet.runner.pod evaluate`, configured by tracefleet.contract.podenv.EvaluatorEnv. With a task
in the environment (set by the operator) the runner's evaluators judge it exactly as in local mode: the
task's workspace is rebuilt, the uploaded session.patch applied to a fresh copy, and the evaluator preset
picks `tests` (FAIL_TO_PASS / PASS_TO_PASS), `hook` (its entry point) or `command` (its argv), mapped to
the runner's evaluator types by tracefleet.contract.semantics. Without a task: run the command in the
downloaded artifacts folder (reward 1.0 on exit 0, 0.0 otherwise; JSON {"reward": x} on stdout wins).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tracefleet.contract import layout, podenv
from tracefleet.contract.semantics import evaluator_type, group_id
from tracefleet.bucket import Bucket
from tracefleet.contract.podenv import EVALUATOR_FATAL_EXIT_CODE, EvaluatorEnv, PodEnvError
from tracefleet.runner.evaluators import EvalContext, EvaluatorSpec, get_evaluator
from tracefleet.runner.pod.evidence import download_capture, uploaded_evidence
from tracefleet.runner.pod.harness import task_from_env
from tracefleet.runner.workspace import WorkspaceError, prepare_workspace

def evaluate(bucket: Bucket, job: str, session: int, command: list[str], timeout_s: float = 600) -> dict[str, Any]:
    """Without a task: run `command` in the downloaded artifacts folder."""
    with tempfile.TemporaryDirectory() as tmp:
        _download(bucket, layout.artifacts_prefix(job, session), Path(tmp))
        try:
            proc = subprocess.run(command, cwd=tmp, capture_output=True, text=True, timeout=timeout_s)
            reward = 1.0 if proc.returncode == 0 else 0.0
            try:
                reward = float(json.loads(proc.stdout.strip().splitlines()[-1])["reward"])
            except (ValueError, KeyError, IndexError, TypeError):
                pass
            result = {"reward": reward, "status": "ok", "exit_code": proc.returncode}
        except subprocess.TimeoutExpired:
            result = {"reward": 0.0, "status": "timeout"}
    bucket.put(layout.reward_key(job, session), json.dumps(result).encode())
    return result


def _download(bucket: Bucket, prefix: str, dest: Path) -> int:
    count = 0
    for obj in bucket.list(prefix):
        target = dest / obj.key.split(prefix, 1)[-1]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(bucket.get(obj.key))
        count += 1
    return count


def evaluator_spec(env: EvaluatorEnv) -> EvaluatorSpec:
    try:
        kind = evaluator_type(env.evaluator)
    except ValueError as exc:
        raise PodEnvError(f"{podenv.EVALUATOR}: {exc}") from None
    return EvaluatorSpec(type=kind, command=env.command, entrypoint=env.entrypoint, timeout_s=env.timeout_s)  # type: ignore[arg-type]


def evaluate_session(bucket: Bucket, env: EvaluatorEnv) -> tuple[dict[str, Any], int]:
    """Judge one session with the runner's evaluators; (reward.json body, exit code). Fails closed:
    missing artifacts, a workspace that cannot be rebuilt or an evaluator error are reward 0."""
    job, session = env.job, env.session
    spec = evaluator_spec(env)
    task = task_from_env(env, Path.cwd().resolve())
    result: dict[str, Any] = {"reward": 0.0, "task_id": task.id, "sample_index": env.sample_index, "evaluator": spec.type}
    code = 0
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = Path(tmp) / "artifacts"
        artifacts.mkdir()
        _download(bucket, layout.artifacts_prefix(job, session), artifacts)
        patch_file = artifacts / layout.PATCH
        harness = json.loads((artifacts / layout.RESULT).read_text()) if (artifacts / layout.RESULT).exists() else {}
        if not patch_file.exists():
            result.update(status="error", message=f"no {layout.artifacts_prefix(job, session)}{layout.PATCH}: "
                                                  "the harness pod uploaded no diff")
            code = EVALUATOR_FATAL_EXIT_CODE  # retrying cannot produce the missing upload
        else:
            session_dir = Path(tmp) / "session"
            try:
                workspace = prepare_workspace(task, session_dir, setup_timeout_s=spec.timeout_s)
            except WorkspaceError as exc:
                result.update(status="error", message=f"rebuilding the task's workspace failed: {exc}")
                code = 1
            else:
                spec.env[podenv.ARTIFACTS_DIR] = str(artifacts)
                ctx = EvalContext(
                    task=task, workspace=workspace, patch=patch_file.read_text(), session_dir=session_dir,
                    harness_exit_code=harness.get("harness_exit_code"), harness_stdout=artifacts / layout.HARNESS_STDOUT,
                    metadata={"session_id": f"{job}-s{session}", "sample_index": env.sample_index},
                )
                try:
                    outcome = get_evaluator(spec).evaluate(ctx)
                except Exception as exc:  # noqa: BLE001 - evaluators fail closed; this catches their construction
                    result.update(status="error", message=f"{type(exc).__name__}: {exc}")
                else:
                    result.update(reward=outcome.reward if outcome.status == "ok" else 0.0, status=outcome.status,
                                  message=outcome.message, details=outcome.details, duration_s=round(outcome.duration_s, 3))
        # the diagnostics' evidence, built here where the task, the patch and the judging are (runner.pod.evidence),
        # with the session's group and the job's policy version as local mode keeps them: `tracefleet diagnose`
        # reads it as stored
        evidence = uploaded_evidence(job=job, session_id=f"{job}-s{session}", task=task, group_id=group_id(job, task.id),
                                     sample_index=env.sample_index, artifacts=artifacts,
                                     capture=download_capture(bucket, job, session, Path(tmp) / layout.CAPTURE_LOG),
                                     evaluation=result, policy_version=env.policy_version)
    bucket.put(layout.evidence_key(job, evidence.session_id), evidence.model_dump_json().encode())
    bucket.put(layout.reward_key(job, session), json.dumps(result, default=str).encode())
    return result, code
