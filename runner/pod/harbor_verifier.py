"""The evaluator Job of a Harbor task: Harbor's verifier contract in a fresh container of the task's own image,
with the agent's change set applied (tracefleet.harbor.task_image_programs has why and how it compares with the
local snapshot). Three steps, in order, in one pod (tracefleet.operator.children.jobs builds it):

    fetch   (init, tracefleet image)  `python -m tracefleet.runner.pod harbor-fetch EVAL_DIR`: the session's change set from
                                      its uploaded artifacts and the task's tests/ from the task source (never from
                                      anything the session wrote) into the shared volume
    verify  (init, the task image)    task_image_programs.VERIFIER: apply, fresh /tests and /logs/verifier, test.sh under the
                                      verifier's timeout
    report  (the tracefleet image)    `python -m tracefleet.runner.pod harbor-report EVAL_DIR LOGS_DIR`: the verdict read from the verifier
                                      logs' volume (harbor_outcome.harbor_verdict), stored as reward.json with the
                                      session's evidence, as every evaluator Job stores it

A step that cannot do its part leaves one line in ti.FETCH_ERROR (fetch) or no exit status (verify): the report
step turns it into a fail-closed verdict with that reason, so the session is a row with reward 0, never a retry
loop.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tracefleet.bucket import Bucket, BucketError, ObjectNotFound
from tracefleet.contract import layout
from tracefleet.contract import task_image as ti
from tracefleet.contract.harbor import TESTS_DIR
from tracefleet.contract.podenv import EvaluatorEnv, PodEnvError
from tracefleet.contract.session import EvalOutcome, SessionPlan, SessionResult, Verdict
from tracefleet.harbor.folders import task_folders
from tracefleet.harbor.sources import TaskSourceError, is_tarball, open_source
from tracefleet.runner.containers.harbor_outcome import eval_outcome_of_verdict, verdict_here
from tracefleet.runner.pod.evaluator_job import store_verdict
from tracefleet.runner.session import judged_by


def task_tests(uri: str, task: str, dest: Path, scratch: Path) -> None:
    """The task's tests/ from the task source into `dest`. An s3:// prefix is read one task folder at a time
    (`<prefix>/<task>/`), else the whole source (a tarball, or a prefix that is itself one task folder)."""
    root = None
    if uri.startswith("s3://") and not is_tarball(uri):
        try:
            # into a folder of the task's name: a source that is one task folder is named by its folder
            root = open_source(f"{uri.rstrip('/')}/{task}", scratch / "one" / task)
        except TaskSourceError:
            root = None
    if root is None:
        root = open_source(uri, scratch / "all")
    folder = next((f for f in task_folders(root) if f.name == task), None)
    if folder is None or not (folder / TESTS_DIR).is_dir():
        raise TaskSourceError(f"{uri}: no task folder {task!r} with a {TESTS_DIR}/ folder")
    shutil.copytree(folder / TESTS_DIR, dest, symlinks=True)


def fetch(bucket: Bucket, env: EvaluatorEnv, into: Path = Path(ti.EVAL_DIR)) -> str | None:
    """The verify step's inputs into `into`; None, or the one line that says what is missing (also left in
    ti.FETCH_ERROR for the other steps)."""
    harbor = env.plan.task.harbor
    if harbor is None:
        raise PodEnvError("the Harbor fetch step needs a Harbor task's plan")
    into.mkdir(parents=True, exist_ok=True)
    into.chmod(0o777)  # the verify step runs as the task's verifier user and writes its results here
    problem = None
    prefix = layout.artifacts_prefix(env.plan.job, env.plan.index)
    try:
        for name in (ti.CHANGES, ti.DELETED):
            (into / name).write_bytes(bucket.get(prefix + name))
    except ObjectNotFound:
        problem = f"the harness pod uploaded no change set ({prefix}{ti.CHANGES}, {ti.DELETED})"
    if problem is None:
        with tempfile.TemporaryDirectory() as scratch:
            try:
                # on a cluster the plan's task folder is the task source (spec.tasks.harbor.uri)
                task_tests(harbor.folder, env.plan.task.id, into / ti.EVAL_TESTS, Path(scratch))
            except (TaskSourceError, BucketError, OSError) as exc:
                problem = f"the task's tests: {exc}"
    if problem is not None:
        (into / ti.FETCH_ERROR).write_text(problem + "\n")
    return problem


def report(bucket: Bucket, env: EvaluatorEnv, eval_dir: Path = Path(ti.EVAL_DIR),
           logs: Path = Path(ti.VERIFIER_LOGS_DIR)) -> tuple[Verdict, int]:
    """The verdict stored as reward.json, with the session's evidence; only a completed session's change set is
    judged (as every evaluator judges only completed sessions)."""

    def judging(plan: SessionPlan, result: SessionResult, artifacts: Path, tmp: Path) -> tuple[EvalOutcome, int]:
        harbor = plan.task.harbor
        timeout_s = harbor.verifier_timeout_s if harbor is not None and harbor.verifier_timeout_s else 0.0
        outcome = eval_outcome_of_verdict(verdict_here(eval_dir, logs, timeout_s))
        outcome.details.update(judged_by(plan))  # as judge() marks a local Harbor verdict
        return outcome, 0

    return store_verdict(bucket, env, judging)
