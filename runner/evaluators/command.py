"""`command` evaluator: run a command; reward from a JSON line on stdout, else from the exit code.

The last non-empty stdout line, if it is a JSON object with a numeric `reward`, gives the reward
(other keys land in details). Otherwise exit code 0 is reward 1, exit 75 (EX_TEMPFAIL,
tracefleet.contract.semantics.EVALUATOR_UNAVAILABLE_EXIT_CODE) says the command could not judge (status
`unavailable`: the infrastructure's, left out of training and judged again) and anything else is reward 0.
A command whose program does not start is `unavailable` too, unless the program lies in the judged copy (the
agent may have removed it).

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
    unavailable_exit,
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
        argv = argv_of(self.spec.command)  # type: ignore[arg-type]
        failure = process_failure(result, "evaluator command", argv, cwd)
        if failure:
            failure.details["stderr_tail"] = tail(result.stderr_path)
            return failure
        stdout = result.stdout_path.read_text(errors="replace") if result.stdout_path else ""
        details = {"exit_code": result.exit_code, "stderr_tail": tail(result.stderr_path, 1000)}
        parsed = reward_line(stdout)
        if parsed is not None:
            details.update({k: v for k, v in parsed.items() if k != "reward"})
            return EvalOutcome(reward=finite_reward(parsed["reward"]), details=details)
        if (unavailable := unavailable_exit(result, "evaluator command")) is not None:
            unavailable.details = details
            return unavailable
        return EvalOutcome(reward=1.0 if result.exit_code == 0 else 0.0, details=details)
