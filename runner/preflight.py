"""What `tracefleet run` checks before it starts an engine: the parts of this machine a job's sessions need.

A session that cannot start its harness fails before its first model call, is retried, and is sealed
fail-closed: minutes of engine start-up and three tries per session to learn that a CLI is not installed.
Each check here names the setup part that installs what is missing (hack/setup.d/), in one line.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from tracefleet.api.harness_files import command_problems

if TYPE_CHECKING:
    from tracefleet.contract.job import RolloutJob
    from tracefleet.contract.session import Task

# The setup parts a missing piece comes from (hack/setup.d/), and the smallest door that runs each.
HARNESSES_PART = ("hack/setup.d/50-harnesses.sh", "train")
ENGINE_PART = ("hack/setup.d/40-engine.sh", "quickstart")


class PreflightError(RuntimeError):
    """The job cannot start here; `problems` are the lines that say why (each names what to run)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _setup(part: tuple[str, str]) -> str:
    script, door = part
    return f"run `bash {script}` (or `bash hack/setup.sh {door}`)"


def _which(program: str) -> str | None:
    """`program` as a session finds it (runner.sandbox.base_env's PATH)."""
    from tracefleet.runner.sandbox import session_path

    return shutil.which(program, path=session_path())


def harness_problems(preset: str, command: list[str] | None, task_dirs: list[Path | None],
                     job_dir: Path) -> list[str]:
    """Whether the harness a job names can start here: a real CLI installed (and Node to run it), the `command`
    preset's program found, and the script it runs (`python agent.py`) where each session runs it: in its task's
    workspace (`task_dirs`, None for a task without a local one), or given as an absolute path ({job_dir}/...)."""
    from tracefleet.runner.presets import cli_pin, installed_binary

    pin = cli_pin(preset)
    if pin is None:
        return command_problems(command, task_dirs, job_dir, _which)
    if installed_binary(preset) is None and _which(pin.bin) is None:
        return [f"spec.harness.preset: {preset} needs its CLI ({pin.package}@{pin.version}, `{pin.bin}`), "
                f"which is not installed: {_setup(HARNESSES_PART)}"]
    if _which("node") is None:
        return [f"spec.harness.preset: {preset} runs on Node.js, which is not on PATH: install Node >= 20.6 "
                f"and {_setup(HARNESSES_PART)}"]
    return []


def engine_problems(local_engine: bool) -> list[str]:
    """The CPU engine a job without an engine URL starts: llama-cpp-python installed."""
    if local_engine and importlib.util.find_spec("llama_cpp") is None:
        return [f"spec.inference.managed: the CPU engine needs llama-cpp-python, which is not installed: "
                f"{_setup(ENGINE_PART)} (or pass --engine-url URL of an engine that runs)"]
    return []


def preflight(job: RolloutJob, tasks: list[Task], job_dir: Path, *, local_engine: bool) -> list[str]:
    """Every problem found, one line each (empty: the run may start its engine). Tasks that run in their own
    image (Harbor) bring their programs with them: the harness is checked for the host's tasks only."""
    from tracefleet.contract.plan import harness_config
    from tracefleet.contract.session import is_remote

    host_tasks = [t for t in tasks if t.harbor is None]
    problems = engine_problems(local_engine)
    if host_tasks:
        # a fetched repository, an archive or setup commands are only known once a session ran them: not judged
        known = [t for t in host_tasks if not t.archive and not t.setup and not (t.repo and is_remote(t.repo))]
        dirs = [Path(t.repo) if t.repo and Path(t.repo).is_dir() else None for t in known]
        harness = harness_config(job)
        problems += harness_problems(harness.preset, harness.command, dirs, job_dir)
    return problems
