"""Whether the files a `command` harness runs are there: its program when given as a path, and the script an
interpreter runs (`python agent.py`), where each session runs it: in its task's workspace, or as an absolute path
({job_dir}/...). One check for `tracefleet validate` and `tracefleet run`'s preflight (which adds the PATH)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tracefleet.contract.session import with_job_dir

# Programs that run a script named by their first argument: the script is the agent, and must be there too.
INTERPRETERS = ("python", "python3", "node", "bash", "sh")


def command_problems(command: list[str] | None, task_dirs: list[Path | None], job_dir: Path,
                     which: Callable[[str], str | None] | None = None) -> list[str]:
    """One line per problem; `task_dirs`: each session's working directory (None: not known here); `which`: how a
    session finds a bare program name (None: not checked, as on another machine)."""
    argv = with_job_dir(list(command or ()), job_dir)
    if not argv or "{" in argv[0]:
        return []  # a program named by a placeholder is only known per session
    program = argv[0]
    if "/" in program:
        if not (Path(program).is_absolute() and Path(program).exists()):
            if Path(program).is_absolute():
                return [f"spec.harness.command: {program}: no such file"]
            return _relative_problems("program", program, task_dirs, job_dir)
    elif which is not None and which(program) is None:
        return [f"spec.harness.command: {program!r} is not on PATH"]
    script = argv[1] if len(argv) > 1 and Path(program).name in INTERPRETERS else None
    if script is None or script.startswith("-") or "{" in script:
        return []
    if Path(script).is_absolute():
        return [] if Path(script).exists() else [f"spec.harness.command: {script}: no such file"]
    return _relative_problems("script", script, task_dirs, job_dir)


def _relative_problems(what: str, rel: str, task_dirs: list[Path | None], job_dir: Path) -> list[str]:
    """A relative path in the command is read in each session's working directory, its task's workspace."""
    if all(d is not None and (d / rel).exists() for d in task_dirs):
        return []  # (no task whose workspace is known here: nothing to say)
    hint = (f"; the file next to the job file is `{{job_dir}}/{rel}`" if (job_dir / rel).exists()
            else f" (nor next to the job file, {job_dir})")
    return [f"spec.harness.command: the {what} {rel!r} is not in every session's working directory (a session "
            f"runs in its task's workspace){hint}"]
