"""Evaluators: judge a finished session and give it a reward, failing closed.

`get_evaluator(spec)` returns one of: `command` (exit code or JSON reward), `tests` (SWE-bench style
FAIL_TO_PASS / PASS_TO_PASS on a fresh patched copy), `python` (your function), `none` (reward 0,
status skipped: for pure data generation), `harbor` (Harbor's verifier on a session that ran in its task's
container: tracefleet.runner.evaluators.harbor).
"""

from __future__ import annotations

from tracefleet.runner.evaluators.base import EvalContext, EvalOutcome, EvaluatorSpec, RunnableEvaluator
from tracefleet.runner.evaluators.command import CommandEvaluator
from tracefleet.runner.evaluators.harbor import HarborEvaluator
from tracefleet.runner.evaluators.hook import PythonHookEvaluator
from tracefleet.runner.evaluators.tests import TestsEvaluator


class NoEvaluator:
    def __init__(self, spec: EvaluatorSpec) -> None:
        self.spec = spec

    def evaluate(self, ctx: EvalContext) -> EvalOutcome:
        return EvalOutcome(reward=0.0, status="skipped", message="no evaluator configured")


def get_evaluator(spec: EvaluatorSpec) -> RunnableEvaluator:
    kinds = {"command": CommandEvaluator, "tests": TestsEvaluator, "python": PythonHookEvaluator, "harbor": HarborEvaluator,
             "none": NoEvaluator}
    return kinds[spec.type](spec)


__all__ = ["EvalContext", "EvalOutcome", "EvaluatorSpec", "RunnableEvaluator", "get_evaluator"]
