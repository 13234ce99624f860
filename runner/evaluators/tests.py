"""`tests` evaluator (SWE-bench style): apply the session's patch to a fresh copy of the original
workspace, restore protected files (the tests themselves), run the test command, and give reward 1
only when every FAIL_TO_PASS and every PASS_TO_PASS test passed.

The test command is a template: `{tests}` becomes the shell-quoted test names, `{python}` the
runner's interpreter. Default: pytest with `-rA`, whose summary lines (`PASSED id`, `FAILED id`,
`ERROR id`) say which tests passed. With `per_test: true` the command runs once per test (`{test}`)
and the exit code decides: that works for any test runner.
"""

from __future__ import annotations

import re
import shlex
import sys

from tracefleet.runner.evaluators.base import EvalContext, EvalOutcome, EvaluatorSpec, tail
from tracefleet.runner.evaluators.common import argv_of, patched_copy, process_failure, run_judged, timed

DEFAULT_TEST_COMMAND = ["{python}", "-m", "pytest", "-rA", "-p", "no:cacheprovider", "-o", "addopts=", "{tests}"]
SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|XPASS|XFAIL|SKIPPED)\s+(\S+)")


def pytest_results(output: str) -> dict[str, str]:
    """Test id -> PASSED/FAILED/ERROR/... from pytest's -rA short summary."""
    results: dict[str, str] = {}
    for line in output.splitlines():
        match = SUMMARY.match(line.strip())
        if match:
            state, name = match.groups()
            # An id that both passed (call) and errored (teardown) did not pass.
            if results.get(name) in ("FAILED", "ERROR"):
                continue
            results[name] = state
    return results


def expand_command(command: str | list[str], tests: list[str], test: str | None) -> list[str]:
    """Fill the template. A shell string gets quoted names; in an argv list an element that is
    exactly `{tests}` becomes one argument per test."""
    if isinstance(command, str):
        filled = (
            command.replace("{python}", shlex.quote(sys.executable))
            .replace("{tests}", " ".join(shlex.quote(t) for t in tests))
            .replace("{test}", shlex.quote(test or ""))
        )
        return argv_of(filled)
    argv: list[str] = []
    for arg in command:
        if arg == "{tests}":
            argv.extend(tests)
        else:
            argv.append(arg.replace("{python}", sys.executable).replace("{test}", test or "").replace("{tests}", " ".join(tests)))
    return argv


class TestsEvaluator:
    __test__ = False  # not a pytest class

    def __init__(self, spec: EvaluatorSpec) -> None:
        self.spec = spec
        self.per_test = bool((spec.model_extra or {}).get("per_test", False))

    def _command(self, ctx: EvalContext) -> str | list[str]:
        return ctx.task.test_command or self.spec.command or DEFAULT_TEST_COMMAND

    @timed
    def evaluate(self, ctx: EvalContext) -> EvalOutcome:
        cwd = patched_copy(ctx)
        wanted = list(dict.fromkeys([*ctx.task.fail_to_pass, *ctx.task.pass_to_pass]))
        template = self._command(ctx)
        if self.per_test and wanted:
            passed: dict[str, bool] = {}
            for i, name in enumerate(wanted):
                result = run_judged(ctx, self.spec, expand_command(template, [name], name), cwd, f"test-{i}")
                failure = process_failure(result, f"test {name}")
                if failure:
                    return failure
                passed[name] = result.exit_code == 0
        else:
            result = run_judged(ctx, self.spec, expand_command(template, wanted, None), cwd, "tests")
            failure = process_failure(result, "test command")
            if failure:
                failure.details["output_tail"] = tail(result.stdout_path)
                return failure
            output = result.stdout_path.read_text(errors="replace") if result.stdout_path else ""
            if not wanted:
                return EvalOutcome(
                    reward=1.0 if result.exit_code == 0 else 0.0,
                    details={"exit_code": result.exit_code, "output_tail": tail(result.stdout_path, 1000)},
                )
            states = pytest_results(output)
            if not states and result.exit_code not in (0, 1):
                # pytest exit codes 2-5: interrupted, internal error, usage error, nothing collected.
                return EvalOutcome(
                    status="error",
                    message=f"test command exited {result.exit_code} without test results",
                    details={"output_tail": tail(result.stdout_path)},
                )
            passed = {name: states.get(name) in ("PASSED", "XPASS") for name in wanted}
        f2p = {n: passed[n] for n in ctx.task.fail_to_pass}
        p2p = {n: passed[n] for n in ctx.task.pass_to_pass}
        ok = all(f2p.values()) and all(p2p.values())
        return EvalOutcome(
            reward=1.0 if ok else 0.0,
            details={
                "fail_to_pass": f2p,
                "pass_to_pass": p2p,
                "resolved": ok,
            },
        )
