"""`python` evaluator: a function of yours, `module:function` or the name of an entry point in the
`tracefleet.evaluators` group. It runs in a child interpreter (so it can be timed out and cannot
crash the runner) and gets a dict: task, patch, original, workdir, session_dir, harness_exit_code.
It returns a number (the reward) or a dict with `reward` and anything else for details; a hook that cannot
judge (its grading service is down) exits 75 (`sys.exit(75)`: status `unavailable`, tracefleet.contract.semantics).
"""

from __future__ import annotations

import json
import sys
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any, Callable

from tracefleet.runner.evaluators.base import EvalContext, EvalOutcome, EvaluatorSpec, tail
from tracefleet.runner.evaluators.common import finite_reward, process_failure, run_judged, timed, unavailable_exit
from tracefleet.contract import environment

ENTRY_POINT_GROUP = "tracefleet.evaluators"
RESULT_MARK = environment.HOOK_RESULT_MARK


def load_hook(ref: str) -> Callable[[dict[str, Any]], Any]:
    if ":" in ref:
        module, _, attr = ref.partition(":")
        target: Any = import_module(module)
        for part in attr.split("."):
            target = getattr(target, part)
        return target
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == ref]
    if not found:
        raise LookupError(f"no evaluator entry point named {ref!r} in group {ENTRY_POINT_GROUP}")
    return found[0].load()


class PythonHookEvaluator:
    def __init__(self, spec: EvaluatorSpec) -> None:
        if not spec.entrypoint:
            raise ValueError("the python evaluator needs `entrypoint` (module:function or entry point name)")
        self.spec = spec

    @timed
    def evaluate(self, ctx: EvalContext) -> EvalOutcome:
        ctx_file = ctx.session_dir / "eval-context.json"
        ctx_file.write_text(ctx.to_json())
        argv = [sys.executable, "-m", "tracefleet.runner.evaluators.hook", self.spec.entrypoint, str(ctx_file)]
        result = run_judged(ctx, self.spec, argv, ctx.workspace.original.parent, "hook")
        failure = process_failure(result, f"evaluator hook {self.spec.entrypoint}", argv, ctx.workspace.original.parent)
        if failure:
            return failure
        stdout = result.stdout_path.read_text(errors="replace") if result.stdout_path else ""
        marked = [line for line in stdout.splitlines() if line.startswith(RESULT_MARK)]
        if (unavailable := unavailable_exit(result, f"evaluator hook {self.spec.entrypoint}")) is not None:
            return unavailable
        if result.exit_code != 0 or not marked:
            return EvalOutcome(
                status="error",
                message=f"evaluator hook {self.spec.entrypoint} failed (exit {result.exit_code})",
                details={"stderr_tail": tail(result.stderr_path)},
            )
        value = json.loads(marked[-1][len(RESULT_MARK):])
        if isinstance(value, dict):
            return EvalOutcome(reward=finite_reward(value.get("reward")), details={k: v for k, v in value.items() if k != "reward"})
        return EvalOutcome(reward=finite_reward(value))


def _child(ref: str, ctx_path: str) -> int:
    hook = load_hook(ref)
    with open(ctx_path) as f:
        ctx = json.load(f)
    value = hook(ctx)
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    print(RESULT_MARK + json.dumps(value), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1], sys.argv[2]))
