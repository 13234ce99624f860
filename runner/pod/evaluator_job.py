"""The evaluator Job's program: judge one finished session and write its reward.json (a `Verdict`).

`python -m tracefleet.runner.pod evaluate`, configured by tracefleet.contract.podenv.EvaluatorEnv: the session's plan,
whole, as the operator planned it (tracefleet.contract.plan.plan_sessions), and the bucket. The session program's
judging runs here as it runs locally (tracefleet.runner.session.judge over the plan): the task's workspace is
rebuilt, the uploaded session.patch applied to a fresh copy, and the plan's evaluator judges (`tests`: FAIL_TO_PASS /
PASS_TO_PASS, `python`: the hook's entry point, `command`: its argv, whose exit code 75 says it could not judge, read
by the command evaluator alone). The harness pod's result.json, judged with the verdict (`SessionResult.judged`),
gives the session's evidence (`session.evidence_of`), as local mode's.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from tracefleet.bucket import Bucket
from tracefleet.contract import layout, podenv
from tracefleet.contract.podenv import EVALUATOR_FATAL_EXIT_CODE, EvaluatorEnv
from tracefleet.contract.session import EvalOutcome, SessionPlan, SessionResult, Verdict
from tracefleet.runner.pod.evidence import download_capture, harness_result
from tracefleet.runner.session import eval_context, evidence_of, judge
from tracefleet.runner.workspace import WorkspaceError, prepare_workspace


def _download(bucket: Bucket, prefix: str, dest: Path) -> int:
    count = 0
    for obj in bucket.list(prefix):
        target = dest / obj.key.split(prefix, 1)[-1]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(bucket.get(obj.key))
        count += 1
    return count


Judging = Callable[[SessionPlan, SessionResult, Path, Path], tuple[EvalOutcome, int]]


def evaluate_session(bucket: Bucket, env: EvaluatorEnv) -> tuple[Verdict, int]:
    """Judge one session with the runner's evaluators; (reward.json, exit code). Fails closed: missing
    artifacts, a workspace that cannot be rebuilt or an evaluator error are reward 0."""
    return store_verdict(bucket, env, _judge_workspace)


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


def store_verdict(bucket: Bucket, env: EvaluatorEnv, judging: Judging) -> tuple[Verdict, int]:
    """Download what the session's pod uploaded, judge it with `judging`, and store the verdict (reward.json, naming
    the plan's evaluator) and the session's evidence, built here where the task, the patch and the judging are, as
    local mode builds it (`tracefleet diagnose` and the sealer read it as stored)."""
    # settled at the working directory: where relative task paths start in the evaluator's image
    plan = env.plan.at(Path.cwd().resolve())
    job, session = plan.job, plan.index
    ids = {"task_id": plan.task.id, "sample_index": plan.sample_index, "evaluator": plan.evaluator.type}
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
                               stderr=artifacts / layout.HARNESS_STDERR, policy_version=plan.policy_version)
    bucket.put(layout.evidence_key(job, evidence.session_id), evidence.model_dump_json().encode())
    bucket.put(layout.reward_key(job, session), verdict.model_dump_json().encode())
    return verdict, code
