"""`harbor` evaluator: Harbor's verifier contract on a session that ran in a container of its task's image.

After the agent stopped, the session's container is committed to a snapshot image and the task's tests/test.sh runs
in a FRESH container of it, with /tests a fresh copy of the task folder's tests/ and /logs/verifier a new empty
folder on the host, Python hardened (PYTHONSAFEPATH, PYTHONNOUSERSITE), under [verifier].timeout_sec
(tracefleet.runner.containers.verifier says what each measure prevents). The HarborVerdict becomes the outcome:

    reward    reward.txt's number, or reward.json's "reward" metric: the training reward
    metrics   every metric reward.json holds (reward.txt: {"reward": n}), kept also when the verdict failed closed
    status    ok; timeout (test.sh ran past its time); error (test.sh ran and left no reward or an unreadable one: it ran
              in the agent's environment, so the policy's); unavailable (the snapshot or the verifier's container did
              not run, the task folder did not read: the infrastructure's, tracefleet.contract.semantics), each with
              the verdict's reason as the message: fail-closed, reward 0
"""

from __future__ import annotations

from pathlib import Path

from tracefleet.runner.evaluators.base import EvalContext, EvalOutcome, EvaluatorSpec
from tracefleet.runner.containers.harbor_outcome import outcome_of
from tracefleet.runner.evaluators.common import timed

VERIFIER_LOGS = "verifier"  # in the session's folder: test.sh's output and the reward files


class HarborEvaluator:
    def __init__(self, spec: EvaluatorSpec) -> None:
        self.spec = spec

    @timed
    def evaluate(self, ctx: EvalContext) -> EvalOutcome:
        from tracefleet.harbor.folders import TaskFolderError, load_task
        from tracefleet.runner.containers.place import container_of
        from tracefleet.runner.containers.runtime import ContainerError, require_runtime
        from tracefleet.runner.containers.verifier import snapshot, verify

        harbor = ctx.task.harbor
        if harbor is None:
            return EvalOutcome(status="error", message="the harbor evaluator judges Harbor tasks (spec.tasks.harbor) only")
        record = container_of(ctx.session_dir)
        if record is None:
            return EvalOutcome(status="unavailable", message="harbor verifier: the session ran in no container to verify")
        image = None
        try:
            task = load_task(Path(harbor.folder))
            runtime = require_runtime()
            image = snapshot(runtime, record["name"])
            verdict = verify(runtime, task, image, workdir=record.get("workdir"), log_dir=ctx.session_dir / VERIFIER_LOGS)
        except (ContainerError, TaskFolderError) as err:  # the runtime or the task folder, not the agent
            return EvalOutcome(status="unavailable", message=f"harbor verifier: {err}")
        finally:
            if image is not None:
                runtime.run("rmi", "-f", image, check=False, timeout=120)
        return outcome_of(verdict)
