"""`command` evaluator: run a command; reward from a JSON line on stdout, else from the exit code.

The last non-empty stdout line, if it is a JSON object with a numeric `reward`, gives the reward
(other keys land in details). Otherwise exit code 0 is reward 1 and anything else reward 0.

The command runs hardened (tracefleet.runner.evaluators.common.JudgeFolder): its Python does not import from the
workspace first (a `pytest.py` left there is not the pytest a `python -m pytest` runs), and every pytest it runs
reads no conftest.py or pytest.ini of the workspace.
"""

from __future__ import annotations

import json

from tracefleet.runner.evaluators.base import EvalContext, EvalOutcome, EvaluatorSpec, tail
from tracefleet.runner.evaluators.common import (
    JudgeFolder,
    argv_of,
    finite_reward,
    patched_copy,
    process_failure,
    run_judged,
    timed,
)


def reward_line(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) and "reward" in value else None
        return None
    return None


class CommandEvaluator:
    def __init__(self, spec: EvaluatorSpec) -> None:
        if not spec.command:
            raise ValueError("the command evaluator needs `command`")
        self.spec = spec

    @timed
    def evaluate(self, ctx: EvalContext) -> EvalOutcome:
        cwd = ctx.workspace.workdir if self.spec.live_workspace else patched_copy(ctx)
        judge = JudgeFolder.make(cwd)
        try:
            result = run_judged(ctx, self.spec, argv_of(self.spec.command), cwd, "command", judge=judge)  # type: ignore[arg-type]
        finally:
            judge.remove()
        failure = process_failure(result, "evaluator command")
        if failure:
            failure.details["stderr_tail"] = tail(result.stderr_path)
            return failure
        stdout = result.stdout_path.read_text(errors="replace") if result.stdout_path else ""
        details = {"exit_code": result.exit_code, "stderr_tail": tail(result.stderr_path, 1000)}
        parsed = reward_line(stdout)
        if parsed is not None:
            details.update({k: v for k, v in parsed.items() if k != "reward"})
            return EvalOutcome(reward=finite_reward(parsed["reward"]), details=details)
        return EvalOutcome(reward=1.0 if result.exit_code == 0 else 0.0, details=details)
