"""Helpers shared by evaluators: a fresh patched copy, running a judged process, and the judge's hardening.

The hardening (`JudgeFolder`, used by the `tests` and `command` presets): what the agent left in the workspace must
not stand in for the test runner or its verdict.
  - PYTHONSAFEPATH=1: `python -m pytest` (or any script) does not put the working directory first on sys.path, so a
    `pytest.py` (or any module named like one the runner imports) in the workspace is never imported in its place;
    PYTHONNOUSERSITE=1: no user site-packages; PYTHONDONTWRITEBYTECODE=1: no .pyc left in the workspace.
  - PYTEST_ADDOPTS (every pytest the judge runs, its own command or the user's): `-c` a configuration written here,
    outside the workspace (so no pytest.ini / tox.ini / setup.cfg / pyproject.toml of the workspace is read, and
    its `pythonpath` puts the workspace on sys.path after pytest itself was imported, as the working directory
    was before), `--rootdir` the workspace (test ids stay as the task names them), `--noconftest` (no conftest.py
    of the workspace is loaded: a task whose tests need theirs gives its own test command), `-p no:cacheprovider`,
    and `--junitxml` a report in this folder, outside the workspace, that the `tests` preset reads its verdict from
    (never from lines the tests print).
The folder is a fresh temporary directory made when judging starts (after the agent's processes were killed).
"""

from __future__ import annotations

import math
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tracefleet.contract.layout import PATCH
from tracefleet.contract.semantics import EVALUATOR_UNAVAILABLE_EXIT_CODE
from tracefleet.runner.evaluators.base import EvalContext, EvalOutcome, EvaluatorSpec, tail
from tracefleet.contract.environment import HARDENED_PYTHON_ENV
from tracefleet.runner.sandbox import ProcessResult, run_sandboxed
from tracefleet.runner.workspace import WorkspaceError, apply_patch, fresh_copy, restore_paths
from tracefleet.contract import environment


def patched_copy(ctx: EvalContext, name: str = "eval") -> Path:
    """A fresh copy of the original with the session's patch applied and protected paths restored.
    Raises WorkspaceError when the patch does not apply."""
    target = fresh_copy(ctx.workspace, ctx.session_dir / name)
    apply_patch(target, ctx.patch)
    if ctx.task.protected:
        restore_paths(target, ctx.workspace.original, ctx.task.protected)
    return target


def eval_env(ctx: EvalContext, spec: EvaluatorSpec, cwd: Path) -> dict[str, str]:
    patch_file = ctx.session_dir / PATCH
    if not patch_file.exists():
        patch_file.write_text(ctx.patch)
    env = {
        environment.EVAL_TASK_ID: ctx.task.id,
        environment.EVAL_PATCH_FILE: str(patch_file),
        environment.EVAL_ORIGINAL: str(ctx.workspace.original),
        environment.EVAL_DIR: str(cwd),
        environment.EVAL_HARNESS_EXIT_CODE: "" if ctx.harness_exit_code is None else str(ctx.harness_exit_code),
    }
    if ctx.harness_stdout is not None:
        env[environment.EVAL_HARNESS_STDOUT] = str(ctx.harness_stdout)
    env.update(spec.env)
    return env


def argv_of(command: str | list[str]) -> list[str]:
    return ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)


PYTEST_ADDOPTS = "PYTEST_ADDOPTS"
JUNIT_REPORT = "report.xml"


@dataclass
class JudgeFolder:
    """A fresh folder outside the workspace: the pytest configuration the judge runs with and the report it reads."""

    path: Path
    workspace: Path

    @classmethod
    def make(cls, workspace: Path) -> JudgeFolder:
        folder = cls(Path(tempfile.mkdtemp(prefix="tracefleet-judge-")), workspace)
        folder.config.write_text(f"[pytest]\npythonpath = {workspace}\n")
        return folder

    @property
    def config(self) -> Path:
        return self.path / "pytest.ini"

    def report(self, label: str) -> Path:
        return self.path / f"{label}.{JUNIT_REPORT}"

    def env(self, label: str) -> dict[str, str]:
        self.report(label).unlink(missing_ok=True)
        opts = ["-p", "no:cacheprovider", "--noconftest", "-c", str(self.config), "--rootdir", str(self.workspace),
                f"--junitxml={self.report(label)}"]
        return {**HARDENED_PYTHON_ENV, PYTEST_ADDOPTS: shlex.join(opts)}

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def run_judged(
    ctx: EvalContext, spec: EvaluatorSpec, argv: list[str], cwd: Path, label: str, timeout_s: float | None = None,
    judge: JudgeFolder | None = None,
) -> ProcessResult:
    """The judged process in `cwd`; with `judge`, hardened (see the module's docstring)."""
    logs = ctx.session_dir / "eval-logs"
    hardened = judge.env(label) if judge is not None else {}
    return run_sandboxed(
        argv,
        cwd=cwd,
        home=ctx.session_dir / "eval-home",
        env={**hardened, **eval_env(ctx, spec, cwd)},
        timeout_s=timeout_s if timeout_s is not None else spec.timeout_s,
        stdout_path=logs / f"{label}.stdout",
        stderr_path=logs / f"{label}.stderr",
    )


def in_judged_copy(program: str, cwd: Path) -> bool:
    """Whether a judged process's program lies in the folder it judges (`./run_tests.sh`): what the agent left
    there, so a program that does not start may be the agent's doing. A bare name (found on PATH) or a path
    outside is the judge's own."""
    if "/" not in program:
        return False
    path = (cwd / program).resolve()
    return path == cwd.resolve() or cwd.resolve() in path.parents


def process_failure(result: ProcessResult, what: str, argv: list[str] | None = None,
                    cwd: Path | None = None) -> EvalOutcome | None:
    """The fail-closed outcome for a process that did not run to its own end, else None. The judge's own
    program that did not start, and a judging the run's stop interrupted, are `unavailable` (the agent could
    not cause them: tracefleet.contract.semantics); a program of the judged copy that did not start is an
    `error`, and a timeout stays `timeout` (the agent's code runs under the judge): the policy's."""
    if result.start_error:
        ours = argv is not None and cwd is not None and not in_judged_copy(argv[0], cwd)
        return EvalOutcome(status="unavailable" if ours else "error", message=f"{what} did not start: {result.start_error}")
    if result.timed_out:
        limit = f"its limit of {result.timeout_s:g} s" if result.timeout_s is not None else "its limit"
        return EvalOutcome(status="timeout", message=f"{what} ran past {limit} (stopped after {result.duration_s:.1f} s)")
    if result.stopped:
        return EvalOutcome(status="unavailable", message=f"{what} was interrupted")
    return None


def unavailable_exit(result: ProcessResult, what: str) -> EvalOutcome | None:
    """`unavailable` when the evaluator's program said it could not judge (exit EVALUATOR_UNAVAILABLE_EXIT_CODE),
    else None. Only where the program's exit status is already the judge's word (`command`: exit 0 is reward 1;
    a hook): never for a test run, whose exit status the agent's code can set."""
    if result.exit_code != EVALUATOR_UNAVAILABLE_EXIT_CODE:
        return None
    said = tail(result.stderr_path, 1000).strip().splitlines()
    return EvalOutcome(status="unavailable", message=f"{what} could not judge (exit {EVALUATOR_UNAVAILABLE_EXIT_CODE})"
                                                      + (f": {said[-1].strip()}" if said else ""))


def finite_reward(value: object) -> float:
    reward = float(value)  # type: ignore[arg-type]
    if not math.isfinite(reward):
        raise ValueError(f"reward {value!r} is not a finite number")
    return reward


def timed(fn):  # type: ignore[no-untyped-def]
    """Wrap evaluate(): measure it and turn any exception into a fail-closed outcome."""

    def wrapper(self, ctx: EvalContext) -> EvalOutcome:  # type: ignore[no-untyped-def]
        started = time.monotonic()
        try:
            outcome = fn(self, ctx)
        except WorkspaceError as exc:
            outcome = EvalOutcome(status="patch_failed", message=str(exc))
        except Exception as exc:  # noqa: BLE001 - fail closed on anything
            outcome = EvalOutcome(status="error", message=f"{type(exc).__name__}: {exc}")
        if outcome.status != "ok":
            outcome.reward = 0.0
        outcome.duration_s = time.monotonic() - started
        return outcome

    return wrapper


__all__ = ["JudgeFolder", "patched_copy", "run_judged", "process_failure", "unavailable_exit", "finite_reward", "timed",
           "argv_of", "shlex"]
