"""One Harbor task folder: load it for a run, or check it for `tracefleet validate` (every problem one line,
`FILE: field.path: message`, FILE relative to the task source)."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from tracefleet.contract.harbor import (
    DOCKERFILE,
    ENVIRONMENT_DIR,
    INSTRUCTION,
    SOLUTION_DIR,
    TASK_CONFIG,
    TEST_SCRIPT,
    TESTS_DIR,
    TaskConfig,
)

# What makes a folder of a task source a task folder (one missing the rest is then reported, not skipped).
_MARKERS = (TASK_CONFIG, INSTRUCTION, TESTS_DIR)
_FROM = re.compile(r"^\s*FROM\s+\S", re.I | re.M)
# Data-provenance markers at the top of an instruction (Harbor strips them too): never shown to the agent.
_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.I)


def strip_canary(text: str) -> str:
    lines = text.split("\n")
    start = 0
    while start < len(lines) and _CANARY.match(lines[start].strip()):
        start += 1
    while start < len(lines) and not lines[start].strip():
        start += 1
    return "\n".join(lines[start:])


@dataclass(frozen=True)
class TaskProblem:
    file: str  # relative to the task source, e.g. "hello/task.toml"
    path: str  # field path inside the file; "" for the file itself
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.path}: {self.message}" if self.path else f"{self.file}: {self.message}"


class TaskFolderError(ValueError):
    def __init__(self, problems: list[TaskProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(map(str, problems)))


@dataclass(frozen=True)
class HarborTask:
    """A task folder that passed `check_task`. `name` is the folder's name (the task id)."""

    name: str
    folder: Path
    config: TaskConfig
    instruction: str

    @property
    def environment_dir(self) -> Path:
        return self.folder / ENVIRONMENT_DIR

    @property
    def tests_dir(self) -> Path:
        return self.folder / TESTS_DIR

    @property
    def solution_dir(self) -> Path:
        return self.folder / SOLUTION_DIR

    @property
    def prebuilt_image(self) -> str | None:
        """The image task.toml names; when set it is used as is (Harbor: the Dockerfile is then optional)."""
        return self.config.environment.docker_image


def _pydantic_problems(file: str, err: ValidationError) -> list[TaskProblem]:
    out = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"] if not (isinstance(p, str) and p.startswith(("function-", "constrained-"))))
        message = e["msg"].removeprefix("Value error, ")
        if e["type"] not in ("missing", "value_error"):
            message += f"; got {e['input']!r}"
        out.append(TaskProblem(file, loc, message))
    return list(dict.fromkeys(out))


def read_config(folder: Path, label: str) -> tuple[TaskConfig | None, list[TaskProblem]]:
    file = f"{label}/{TASK_CONFIG}"
    path = folder / TASK_CONFIG
    if not path.is_file():
        return None, [TaskProblem(file, "", "missing: every Harbor task folder has a task.toml")]
    try:
        data = tomllib.loads(path.read_text())
    except UnicodeDecodeError:
        return None, [TaskProblem(file, "", "not a text file")]
    except tomllib.TOMLDecodeError as err:
        return None, [TaskProblem(file, "", f"invalid TOML: {err}")]
    try:
        return TaskConfig.model_validate(data), []
    except ValidationError as err:
        return None, _pydantic_problems(file, err)


def check_task(folder: Path, label: str | None = None) -> tuple[HarborTask | None, list[TaskProblem]]:
    """The task in `folder` and every problem found (all of them, not the first): the task is None when there
    is any. `label` names the folder in the messages (default: its name)."""
    label = label or folder.name
    config, problems = read_config(folder, label)
    instruction = ""
    if not (folder / INSTRUCTION).is_file():
        problems.append(TaskProblem(f"{label}/{INSTRUCTION}", "", "missing: the agent would be asked nothing"))
    else:
        instruction = strip_canary((folder / INSTRUCTION).read_text(errors="replace"))
        if not instruction.strip():
            problems.append(TaskProblem(f"{label}/{INSTRUCTION}", "", "empty: the agent would be asked nothing"))
    if not (folder / TESTS_DIR / TEST_SCRIPT).is_file():
        problems.append(TaskProblem(f"{label}/{TESTS_DIR}/{TEST_SCRIPT}", "",
                                    "missing: the verifier runs it to score the session"))
    if config is not None:
        if config.verifier.separate:
            problems.append(TaskProblem(f"{label}/{TASK_CONFIG}", "verifier.environment",
                                        "a separate verifier environment is not supported (tracefleet verifies in a "
                                        "fresh container of the task's image with the agent's changes applied)"))
        if config.environment.os != "linux":
            problems.append(TaskProblem(f"{label}/{TASK_CONFIG}", "environment.os",
                                        f"{config.environment.os!r} tasks are not supported (linux only)"))
        if config.environment.docker_image is None:
            dockerfile = folder / ENVIRONMENT_DIR / DOCKERFILE
            where = f"{label}/{ENVIRONMENT_DIR}/{DOCKERFILE}"
            if not dockerfile.is_file():
                problems.append(TaskProblem(where, "", "missing, and task.toml names no environment.docker_image: "
                                                       "nothing to run the task in"))
            elif not _FROM.search(dockerfile.read_text(errors="replace")):
                problems.append(TaskProblem(where, "", "no FROM line: not an image build"))
    if problems or config is None:
        return None, problems
    return HarborTask(name=folder.name, folder=folder, config=config, instruction=instruction), []


def load_task(folder: Path) -> HarborTask:
    task, problems = check_task(folder)
    if task is None:
        raise TaskFolderError(problems)
    return task


def is_task_folder(folder: Path) -> bool:
    return folder.is_dir() and any((folder / marker).exists() for marker in _MARKERS)


def task_folders(root: Path, include: list[str] | None = None) -> list[Path]:
    """The task folders under `root`, by name: `root` itself when it is one, else its (non-hidden) subfolders
    that are; `include` keeps the names matching any of its shell patterns (`fnmatch`, e.g. `swe-*`)."""
    if is_task_folder(root):
        found = [root]
    else:
        found = sorted(p for p in root.iterdir() if not p.name.startswith(".") and is_task_folder(p))
    if include:
        found = [p for p in found if any(fnmatch.fnmatchcase(p.name, pattern) for pattern in include)]
    return found


def check_tasks(root: Path, label: str, include: list[str] | None = None) -> tuple[list[HarborTask], list[TaskProblem]]:
    """Every task under `root` (see `task_folders`) and every problem, named from `label` (how the caller wrote
    the source). A folder with problems is left out of the tasks; the others are kept."""
    folders = task_folders(root, include)
    if not folders:
        matching = f" matching {', '.join(include)}" if include else ""
        return [], [TaskProblem(label, "", f"no Harbor task folder{matching} (a folder holding task.toml, "
                                           f"instruction.md and tests/)")]
    tasks: list[HarborTask] = []
    problems: list[TaskProblem] = []
    for folder in folders:
        task, found = check_task(folder, label if folder == root else f"{label.rstrip('/')}/{folder.name}")
        problems += found
        if task is not None:
            tasks.append(task)
    return tasks, problems
