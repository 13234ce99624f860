"""`tests` evaluator (SWE-bench style): apply the session's patch to a fresh copy of the original
workspace, restore protected files (the tests themselves), run the test command, and give reward 1
only when every FAIL_TO_PASS and every PASS_TO_PASS test passed.

The test command is a template: `{tests}` becomes the shell-quoted test names, `{python}` the
runner's interpreter. Default: pytest. Which tests passed is read from the JUnit XML report pytest writes
to the judge's folder outside the workspace (tracefleet.runner.evaluators.common.JudgeFolder: every pytest the
judge runs writes it, also one in a command of the task's), never from lines the tests print: a `pytest.py`
in the workspace is not imported (PYTHONSAFEPATH), a conftest.py or pytest.ini there is not read, and
text that code prints cannot forge the report. A command that writes no report is fail-closed when tests are
named. With `per_test: true` the command runs once per test (`{test}`) and the exit code decides: that works
for any test runner. The judging is `unavailable` (the infrastructure's: tracefleet.contract.semantics) only when the
judge itself is missing (the test command's program, found outside the judged copy, did not start; the default
command's interpreter has no pytest); a test run's exit status never says so (the agent's code can set it).
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from tracefleet.runner.evaluators.base import EvalContext, EvalOutcome, EvaluatorSpec, tail
from tracefleet.runner.evaluators.common import JudgeFolder, argv_of, patched_copy, process_failure, run_judged, timed

DEFAULT_TEST_COMMAND = ["{python}", "-m", "pytest", "-rA", "{tests}"]
_BAD = {"failure": "FAILED", "error": "ERROR", "skipped": "SKIPPED"}


def junit_key(test_id: str) -> str:
    """A pytest node id (`tests/test_a.py::TestB::test_c[1]`) as its JUnit report names it (classname + name:
    `tests.test_a.TestB::test_c[1]`)."""
    path, _, rest = test_id.partition("::")
    parts = rest.split("::") if rest else []
    module = path.removesuffix(".py").replace("/", ".")
    classname = ".".join([module, *parts[:-1]])
    return f"{classname}::{parts[-1]}" if parts else classname


def junit_results(report: Path) -> dict[str, str]:
    """junit_key -> PASSED/FAILED/ERROR/SKIPPED from pytest's JUnit XML report. A test that passed its call but
    errored in teardown is reported twice: the worse state wins."""
    results: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        state = next((_BAD[child.tag] for child in case if child.tag in _BAD), "PASSED")
        key = f"{case.get('classname', '')}::{case.get('name', '')}"
        if results.get(key) not in ("FAILED", "ERROR"):
            results[key] = state
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
        judge = JudgeFolder.make(cwd)
        try:
            return self._judge(ctx, cwd, judge)
        finally:
            judge.remove()

    def _judge(self, ctx: EvalContext, cwd: Path, judge: JudgeFolder) -> EvalOutcome:
        wanted = list(dict.fromkeys([*ctx.task.fail_to_pass, *ctx.task.pass_to_pass]))
        template = self._command(ctx)
        if self.per_test and wanted:
            passed: dict[str, bool] = {}
            for i, name in enumerate(wanted):
                argv = expand_command(template, [name], name)
                result = run_judged(ctx, self.spec, argv, cwd, f"test-{i}", judge=judge)
                failure = process_failure(result, f"test {name}", argv, cwd)
                if failure:
                    return failure
                passed[name] = result.exit_code == 0
        else:
            argv = expand_command(template, wanted, None)
            result = run_judged(ctx, self.spec, argv, cwd, "tests", judge=judge)
            failure = process_failure(result, "test command", argv, cwd)
            if failure:
                failure.details["output_tail"] = tail(result.stdout_path)
                return failure
            if not wanted:
                return EvalOutcome(
                    reward=1.0 if result.exit_code == 0 else 0.0,
                    details={"exit_code": result.exit_code, "output_tail": tail(result.stdout_path, 1000)},
                )
            report = judge.report("tests")
            if not report.is_file():
                if template is DEFAULT_TEST_COMMAND and importlib.util.find_spec("pytest") is None:
                    # the judge's own interpreter ({python}) has no test runner: nothing the agent did
                    return EvalOutcome(status="unavailable", message=f"no pytest in the judge's interpreter {sys.executable}",
                                       details={"output_tail": tail(result.stdout_path)})
                # pytest exits without a report only when it did not run (a program of the workspace exited for it,
                # or the command is no pytest): nothing says which tests passed; the exit status is no judge's word
                # here (the agent's code sets it), so this stays the policy's
                return EvalOutcome(
                    status="error",
                    message=f"test command exited {result.exit_code} without a test report (JUnit XML)",
                    details={"output_tail": tail(result.stdout_path)},
                )
            states = junit_results(report)
            if not states and result.exit_code not in (0, 1):
                # pytest exit codes 2-5: interrupted, internal error, usage error, nothing collected.
                return EvalOutcome(
                    status="error",
                    message=f"test command exited {result.exit_code} without test results",
                    details={"output_tail": tail(result.stdout_path)},
                )
            passed = {name: states.get(junit_key(name)) == "PASSED" for name in wanted}
        f2p = {n: passed[n] for n in ctx.task.fail_to_pass}
        p2p = {n: passed[n] for n in ctx.task.pass_to_pass}
        ok = all(f2p.values()) and all(p2p.values())
        return EvalOutcome(
            reward=1.0 if ok else 0.0,
            details={
                "fail_to_pass": f2p,
                "pass_to_pass": p2p,
                "resolved": ok,
                "output_tail": tail(result.stdout_path),  # the tests' own words, for the session's evidence
            },
        )
