"""Local validation with the apiserver's rules: every problem as `field.path: message`.

Paths are spelled the way the kube-apiserver spells them (`spec.tasks.inline[0].prompt`), so a
message from `tracefleet validate` and one from `kubectl apply` point at the same place.
"""

from __future__ import annotations

import difflib
import re
import tempfile
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from tracefleet.api.harness_files import command_problems
from tracefleet.contract.job import API_VERSION, KIND, RolloutJob
from tracefleet.harbor.folders import TaskProblem, check_tasks
from tracefleet.harbor.sources import TaskSourceError, open_source


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def field_path(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _join(base: str, suffix: str) -> str:
    if not suffix:
        return base
    if not base:
        return suffix.lstrip(".")
    return base + suffix


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Optional, list, dict values, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _models_in(args[0])
    if origin in (typing.Union, types.UnionType, list, tuple):
        return [m for a in args for m in _models_in(a)]
    if origin is dict and len(args) == 2:
        return _models_in(args[1])
    return []


def _fields_at(loc: list[str | int]) -> list[str]:
    """The field names (as spelled on the wire) of the object at `loc` in a RolloutJob: what a typo
    was meant to be. Empty when the location is not inside a known model."""
    models: list[type[BaseModel]] = [RolloutJob]
    for part in loc:
        if isinstance(part, int):
            continue  # list index: the element type was already unwrapped
        nxt: list[type[BaseModel]] = []
        for model in models:
            for name, info in model.model_fields.items():
                if part in (name, info.alias):
                    nxt += _models_in(info.annotation)
        models = nxt
    return [info.alias or name for model in models for name, info in model.model_fields.items()]


def _did_you_mean(word: Any, choices: Iterable[str], *, value: bool = False) -> str:
    """` (did you mean X?)` for the closest choice (a value quoted, a field name bare), or nothing."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close and value else f" (did you mean {close[0]}?)" if close else ""


def _unknown_field(loc: list[str | int]) -> str:
    """An unknown field's message: the CRD's spelling when the key is a field's Python (snake_case) name."""
    fields = _fields_at(loc[:-1])
    camel = to_camel(str(loc[-1]))
    if camel != loc[-1] and camel in fields:
        return f"unknown field: the RolloutJob spells it {camel} (camelCase, as the CRD does)"
    return "unknown field" + _did_you_mean(loc[-1], fields)


def _got(value: Any) -> str:
    """`; got VALUE` for the value a type or range error refused (a mapping or list by its type: it can be long)."""
    if isinstance(value, (dict, list)):
        return f"; got {'a mapping' if isinstance(value, dict) else 'a list'}"
    shown = repr(value)
    return f"; got {shown[:80] + '...' if len(shown) > 80 else shown}"


def problems_from_error(err: ValidationError) -> list[Problem]:
    problems: list[Problem] = []
    for e in err.errors(include_url=False):
        # Union members add their type name to the location (e.g. `int`, `constrained-str`); drop them.
        loc = [p for p in e["loc"] if not (isinstance(p, str) and (p in {"int", "str"} or p.startswith(("constrained-", "function-"))))]
        base = field_path(loc)
        ctx = e.get("ctx") or {}
        if e["type"] == "rule" and "failures" in ctx:
            problems += [Problem(_join(base, fp), msg) for fp, msg in ctx["failures"]]
        elif e["type"] == "missing":
            problems.append(Problem(base, "Required value"))
        elif e["type"] == "extra_forbidden":
            problems.append(Problem(base, _unknown_field(loc)))
        elif e["type"] == "literal_error":
            allowed = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
            problems.append(Problem(base, f"{e['msg']}; got {e['input']!r}" + _did_you_mean(e["input"], allowed, value=True)))
        else:
            problems.append(Problem(base, f"{e['msg']}{_got(e['input'])}"))
    # A union reports one error per member; keep each (path, message) once.
    return list(dict.fromkeys(problems))


def validate_manifest(data: Any) -> list[Problem]:
    """Problems with one RolloutJob manifest (a parsed YAML document); empty when it is valid."""
    if not isinstance(data, dict):
        return [Problem("", f"expected a mapping (a RolloutJob manifest), got {type(data).__name__}")]
    if "kind" in data and data["kind"] != KIND:
        # Another resource (a Deployment, a ConfigMap): its fields' problems would only be noise.
        return [Problem("kind", f"{data['kind']!r} is not a RolloutJob (expected apiVersion: {API_VERSION}, kind: {KIND})")]
    try:
        RolloutJob.from_manifest(data)
    except ValidationError as err:
        return problems_from_error(err)
    return []


def validate_update(old: RolloutJob, new: RolloutJob) -> list[Problem]:
    """Transition rules (CEL `oldSelf`), e.g. managedBy is immutable: what the apiserver checks on update."""
    problems: list[Problem] = []

    def walk(new_obj: Any, old_obj: Any, loc: list[str | int]) -> None:
        if not isinstance(new_obj, BaseModel) or type(new_obj) is not type(old_obj):
            return
        for rule in getattr(type(new_obj), "x_rules", ()):
            if rule.transition and not rule.check(new_obj, old_obj):
                problems.append(Problem(_join(field_path(loc), rule.field_path), rule.message))
        for name, info in type(new_obj).model_fields.items():
            walk(getattr(new_obj, name), getattr(old_obj, name), loc + [info.alias or name])

    walk(new, old, [])
    return problems


def local_problems(doc: Any, base_dir: Path, task_folders: bool = True, job_dir: bool = True) -> list[Problem]:
    """What only the machine that runs the job can check: task sources given as local paths (relative
    to the manifest's directory, as `tracefleet run` reads them) exist. Remote ones are left to the run.
    Read from the manifest as written (a mapping), so that a manifest with schema problems gets these too, in the
    same pass. `task_folders=False` (what `tracefleet run` checks): a Harbor source must open and hold task
    folders, but a folder with problems is no problem of the job (the run refuses that task alone, fail-closed).
    `job_dir`: whether `base_dir` is the manifest's own folder ({job_dir}); from stdin it is not, and the harness's
    files are not judged."""
    from tracefleet.contract.job import is_remote

    def text(node: Any, key: str) -> str | None:
        value = node.get(key) if isinstance(node, dict) else None
        return value if isinstance(value, str) else None

    def missing(value: str | None) -> str | None:
        if not value or is_remote(value):
            return None
        path = Path(value).expanduser()
        where = path if path.is_absolute() else base_dir / path
        if where.exists():
            return None
        return f"{value}: no such file or directory" + ("" if path.is_absolute() else f" (relative to {base_dir})")

    spec = doc.get("spec") if isinstance(doc, dict) else None
    tasks = spec.get("tasks") if isinstance(spec, dict) else None
    if not isinstance(tasks, dict):
        return []
    problems: list[Problem] = []
    if message := missing(text(tasks, "uri")):
        problems.append(Problem("spec.tasks.uri", message))
    harbor = tasks.get("harbor")
    if (uri := text(harbor, "uri")) and not is_remote(uri):
        include = harbor.get("include")
        include = include if isinstance(include, list) and all(isinstance(i, str) for i in include) else None
        count, found = check_harbor_source(uri, base_dir, include)
        if task_folders or not count and not _some_folder(uri, base_dir, include):
            problems += [Problem("spec.tasks.harbor.uri", str(p)) for p in found]
    inline = tasks.get("inline")
    for i, task in enumerate(inline if isinstance(inline, list) else ()):
        workspace = task.get("workspace") if isinstance(task, dict) else None
        for key in ("repo", "archive"):
            if message := missing(text(workspace, key)):
                problems.append(Problem(f"spec.tasks.inline[{i}].workspace.{key}", message))
    return problems + (_harness_files(spec, inline, base_dir) if job_dir else [])


def _harness_files(spec: dict[str, Any], inline: Any, base_dir: Path) -> list[Problem]:
    """The `command` harness's program and script, where its inline tasks' sessions run it (what `tracefleet
    run`'s preflight refuses; the PATH is that machine's, not checked here)."""
    from tracefleet.contract.job import is_remote

    harness = spec.get("harness")
    # a harness with a command is the `command` preset's (HarnessSpec's rules refuse a command beside another preset)
    command = harness.get("command") if isinstance(harness, dict) else None
    if (not isinstance(command, list) or not all(isinstance(a, str) for a in command)
            or not isinstance(inline, list) or spec["tasks"].get("harbor") or spec["tasks"].get("uri")):
        return []
    dirs: list[Path | None] = []
    for task in inline:
        workspace = task.get("workspace") if isinstance(task, dict) else None
        repo = workspace.get("repo") if isinstance(workspace, dict) else None
        if isinstance(workspace, dict) and (workspace.get("archive") or workspace.get("setup")):
            continue  # its working directory is only known once a session made it
        if isinstance(repo, str) and is_remote(repo):
            continue
        where = (base_dir / Path(repo).expanduser()) if isinstance(repo, str) else None
        dirs.append(where if where is not None and where.is_dir() else None)
    lines = command_problems(command, dirs, base_dir)
    return [Problem(*line.split(": ", 1)) for line in lines]


def _some_folder(uri: str, base_dir: Path, include: list[str] | None) -> bool:
    """Whether a local Harbor source opens and holds a task folder (fine or not)."""
    from tracefleet.harbor.folders import task_folders

    with tempfile.TemporaryDirectory(prefix="tracefleet-validate-") as tmp:
        try:
            return bool(task_folders(open_source(uri, Path(tmp), base_dir), include))
        except TaskSourceError:
            return False


def check_harbor_source(uri: str, base_dir: Path, include: list[str] | None = None) -> tuple[int, list[TaskProblem]]:
    """(tasks that are fine, problems) of a local Harbor task source (a directory of task folders, one folder,
    or a tarball), each problem naming its file as `uri/<task>/<file>`."""
    with tempfile.TemporaryDirectory(prefix="tracefleet-validate-") as tmp:
        try:
            root = open_source(uri, Path(tmp), base_dir)
        except TaskSourceError as err:
            return 0, [TaskProblem(uri, "", str(err).removeprefix(f"{uri}: "))]
        tasks, problems = check_tasks(root, uri, include)
        return len(tasks), problems


def validate_text(text: str, base_dir: Path | None = None, task_folders: bool = True,
                  job_dir: bool = True) -> list[tuple[int, list[Problem]]]:
    """(document index, problems) for every YAML document in `text`; a YAML syntax error is one problem.
    With `base_dir` (the manifest's directory) local task paths are checked too (`local_problems`)."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        # One line: the parser's own message spans several (problem, context, a caret under the column).
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return [(0, [Problem("", f"invalid YAML{where}: {getattr(err, 'problem', None) or err}")])]
    if not docs:
        return [(0, [Problem("", "no YAML document found")])]
    results = []
    for i, doc in enumerate(docs):
        problems = validate_manifest(doc)
        if base_dir is not None and not (isinstance(doc, dict) and doc.get("kind", KIND) != KIND):
            problems += local_problems(doc, base_dir, task_folders, job_dir)
        results.append((i, problems))
    return results


def validate_file(path: str | Path, task_folders: bool = True) -> list[tuple[int, list[Problem]]]:
    """Problems of every RolloutJob in a file, local task paths included (see `validate_text`, `local_problems`)."""
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError:
        return [(0, [Problem("", "not a text file (a RolloutJob manifest is YAML)")])]
    return validate_text(text, base_dir=Path(path).resolve().parent, task_folders=task_folders)


def document_name(name: str, index: int, count: int) -> str:
    """How a message names one document of a file: `FILE`, or `FILE[i]` when the file holds several."""
    return f"{name}[{index}]" if count > 1 else name


def problem_lines(name: str, results: list[tuple[int, list[Problem]]]) -> list[str]:
    """`FILE: field.path: message` per problem: the one format `tracefleet validate` and `tracefleet run` print."""
    return [f"{document_name(name, index, len(results))}: {p}" for index, problems in results for p in problems]
