"""The evaluator Job's program: judge one finished session and write its reward.json (a `Verdict`).

`python -m tracefleet.runner.pod evaluate`, configured by tracefleet.contract.podenv.EvaluatorEnv. With a task
in the environment (set by the operator) the session program's judging runs here as it runs locally
(tracefleet.runner.session.judge over a plan): the task's workspace is rebuilt, the uploaded
session.patch applied to a fresh copy, and the evaluator preset picks `tests` (FAIL_TO_PASS /
PASS_TO_PASS), `hook` (its entry point) or `command` (its argv), mapped to the runner's evaluator types
by tracefleet.contract.semantics. The harness pod's result.json, judged with the verdict
(`SessionResult.judged`), gives the session's evidence (`session.evidence_of`), as local mode's. Without a
task: run the command in the downloaded artifacts folder (reward 1.0 on exit 0, 0.0 otherwise; JSON
{"reward": x} on stdout wins).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from tracefleet.contract import layout, podenv
from tracefleet.contract.semantics import EVALUATOR_UNAVAILABLE_EXIT_CODE, evaluator_type, group_id
from tracefleet.bucket import Bucket
from tracefleet.contract.session import (
    EvalOutcome,
    EvaluatorSpec,
    HarnessConfig,
    SessionPlan,
    SessionResult,
    Verdict,
    session_id,
)
from tracefleet.contract.podenv import EVALUATOR_FATAL_EXIT_CODE, EvaluatorEnv, PodEnvError
from tracefleet.runner.pod.evidence import download_capture, harness_result
from tracefleet.runner.pod.harness_pod import task_from_env
from tracefleet.runner.session import eval_context, evidence_of, judge
from tracefleet.runner.workspace import WorkspaceError, prepare_workspace


def evaluate(bucket: Bucket, job: str, session: int, command: list[str], timeout_s: float = 600) -> Verdict:
    """Without a task: run `command` in the downloaded artifacts folder."""
    with tempfile.TemporaryDirectory() as tmp:
        _download(bucket, layout.artifacts_prefix(job, session), Path(tmp))
        try:
            proc = subprocess.run(command, cwd=tmp, capture_output=True, text=True, timeout=timeout_s)
            verdict = Verdict(reward=1.0 if proc.returncode == 0 else 0.0, details={"exit_code": proc.returncode})
            try:
                verdict.reward = float(json.loads(proc.stdout.strip().splitlines()[-1])["reward"])
            except (ValueError, KeyError, IndexError, TypeError):
                if proc.returncode == EVALUATOR_UNAVAILABLE_EXIT_CODE:  # as the command evaluator reads it
                    verdict = Verdict(status="unavailable", details=verdict.details, message="evaluator command could "
                                      f"not judge (exit {EVALUATOR_UNAVAILABLE_EXIT_CODE})")
        except subprocess.TimeoutExpired:
            verdict = Verdict(status="timeout", message=f"evaluator command timed out after {timeout_s:.0f}s")
    bucket.put(layout.reward_key(job, session), verdict.model_dump_json().encode())
    return verdict


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


def session_plan(env: EvaluatorEnv, spec: EvaluatorSpec) -> SessionPlan:
    """The judged session's plan, from the evaluator Job's environment."""
    task = task_from_env(env, Path.cwd().resolve())
    return SessionPlan(session_id=session_id(env.job, env.session), job=env.job, task=task,
                       sample_index=env.sample_index, group_id=group_id(env.job, task.id), harness=HarnessConfig(),
                       evaluator=spec, model="", policy_version=env.policy_version)


Judging = Callable[[SessionPlan, SessionResult, Path, Path], tuple[EvalOutcome, int]]


def evaluate_session(bucket: Bucket, env: EvaluatorEnv) -> tuple[Verdict, int]:
    """Judge one session with the runner's evaluators; (reward.json, exit code). Fails closed: missing
    artifacts, a workspace that cannot be rebuilt or an evaluator error are reward 0."""
    return store_verdict(bucket, env, evaluator_spec(env), _judge_workspace)


def _judge_workspace(plan: SessionPlan, result: SessionResult, artifacts: Path, tmp: Path) -> tuple[EvalOutcome, int]:
    """The task's workspace rebuilt, the uploaded session.patch applied to a fresh copy, the plan's evaluator."""
    patch_file = artifacts / layout.PATCH
    if not patch_file.exists():
        # retrying cannot produce the missing upload
        # storage, not the agent (an empty diff is uploaded too): the infrastructure's (tracefleet.contract.semantics)
        return EvalOutcome(status="unavailable", message=f"no {layout.PATCH} in the session's artifacts: the harness "
                                                         "pod uploaded no diff"), EVALUATOR_FATAL_EXIT_CODE
    session_dir = tmp / "session"
    try:
        workspace = prepare_workspace(plan.task, session_dir, setup_timeout_s=plan.evaluator.timeout_s)
    except WorkspaceError as exc:
        # the task's own workspace, before the agent's patch: the Job's retries run it again
        return EvalOutcome(status="unavailable", message=f"rebuilding the task's workspace failed: {exc}"), 1
    plan.evaluator.env[podenv.ARTIFACTS_DIR] = str(artifacts)
    return judge(plan, eval_context(plan, workspace, patch_file.read_text(), session_dir, result,
                                    artifacts / layout.HARNESS_STDOUT)), 0


def store_verdict(bucket: Bucket, env: EvaluatorEnv, spec: EvaluatorSpec, judging: Judging,
                  evaluator: str | None = None) -> tuple[Verdict, int]:
    """Download what the session's pod uploaded, judge it with `judging`, and store the verdict (reward.json) and
    the session's evidence (`evaluator` names the judge in reward.json, default the spec's type), built here where the task, the patch and the judging are, as local mode builds it
    (`tracefleet diagnose` and the sealer read it as stored)."""
    job, session = env.job, env.session
    plan = session_plan(env, spec)
    ids = {"task_id": plan.task.id, "sample_index": env.sample_index, "evaluator": evaluator or spec.type}
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = Path(tmp) / "artifacts"
        artifacts.mkdir()
        _download(bucket, layout.artifacts_prefix(job, session), artifacts)
        result = harness_result(artifacts, plan)
        outcome, code = judging(plan, result, artifacts, Path(tmp))
        verdict = Verdict(**outcome.model_dump(), **ids)
        patch_file = artifacts / layout.PATCH
        evidence = evidence_of(result.judged(verdict), task=plan.task,
                               capture=download_capture(bucket, job, session, Path(tmp) / layout.CAPTURE_LOG),
                               patch=patch_file.read_text() if patch_file.exists() else "",
                               stderr=artifacts / layout.HARNESS_STDERR, policy_version=env.policy_version)
    bucket.put(layout.evidence_key(job, evidence.session_id), evidence.model_dump_json().encode())
    bucket.put(layout.reward_key(job, session), verdict.model_dump_json().encode())
    return verdict, code
