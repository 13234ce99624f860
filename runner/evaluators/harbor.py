"""`harbor` evaluator: Harbor's verifier contract on a session that ran in a container of its task's image.

After the agent stopped, what it changed in the session's container (its layer diff against the task image) is applied
to a FRESH container of the task image, the image's own programs kept, and the task's tests/test.sh runs there,
with /tests a fresh copy of the task folder's tests/ and /logs/verifier a new empty folder on the host, Python
hardened (PYTHONSAFEPATH, PYTHONNOUSERSITE), under [verifier].timeout_sec (tracefleet.runner.containers.verifier
says what each measure prevents). The HarborVerdict becomes the outcome:

    reward    reward.txt's number, or reward.json's "reward" metric: the training reward
    metrics   every metric reward.json holds (reward.txt: {"reward": n}), kept also when the verdict failed closed
    status    ok; timeout (test.sh ran past its time); error (test.sh ran and left no reward or an unreadable one: it ran
              in the agent's environment, so the policy's); unavailable (the change set or the verifier's container did
              not run, the task folder did not read: the infrastructure's, tracefleet.contract.semantics), each with
              the verdict's reason as the message: fail-closed, reward 0
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tracefleet.runner.evaluators.base import EvalContext, EvalOutcome, EvaluatorSpec
from tracefleet.runner.containers.harbor_outcome import eval_outcome_of_verdict
from tracefleet.runner.evaluators.common import timed

VERIFIER_LOGS = "verifier"  # in the session's folder: test.sh's output and the reward files


class HarborEvaluator:
    def __init__(self, spec: EvaluatorSpec) -> None:
        self.spec = spec

    @timed
    def evaluate(self, ctx: EvalContext) -> EvalOutcome:
        from tracefleet.harbor.folders import TaskFolderError, load_task
        from tracefleet.contract.task_image import CHANGES
        from tracefleet.runner.containers.changes import change_set
        from tracefleet.runner.containers.session_record import CHANGE_SET, TOOLS_DIR, container_of
        from tracefleet.runner.containers.runtime import STEPS_FILE, ContainerError, require_runtime, timed_to
        from tracefleet.runner.containers.verifier import Verifier, take

        harbor = ctx.task.harbor
        if harbor is None:
            return EvalOutcome(status="error", message="the harbor evaluator judges Harbor tasks (spec.tasks.harbor) only")
        record = container_of(ctx.session_dir)
        if record is None:
            return EvalOutcome(status="unavailable", message="harbor verifier: the session ran in no container to verify")
        changes = ctx.session_dir / CHANGE_SET  # made by the place when it collected the session
        try:
            task = load_task(Path(harbor.folder))
            runtime = require_runtime()
            with timed_to(ctx.session_dir / STEPS_FILE):
                if not (changes / CHANGES).is_file():
                    change_set(runtime, record["name"], changes,
                               skip=(TOOLS_DIR, *((record["home"],) if record.get("home") else ())))
                # the one the place started while the agent worked (tracefleet.runner.containers.place), else one now
                verifier = take(ctx.session_dir) or Verifier(runtime, task, record["image"], workdir=record.get("workdir"))
                verdict = verifier.judge(changes, log_dir=ctx.session_dir / VERIFIER_LOGS)
        except (ContainerError, TaskFolderError) as err:  # the runtime or the task folder, not the agent
            return EvalOutcome(status="unavailable", message=f"harbor verifier: {err}")
        finally:
            shutil.rmtree(changes, ignore_errors=True)
        return eval_outcome_of_verdict(verdict)
