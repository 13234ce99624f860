"""Local validation with the apiserver's rules: every problem as `field.path: message`.

Paths are spelled the way the kube-apiserver spells them (`spec.tasks.inline[0].prompt`), so a
message from `tracefleet validate` and one from `kubectl apply` point at the same place.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError

from .model import RolloutJob


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
            problems.append(Problem(base, "unknown field"))
        else:
            problems.append(Problem(base, e["msg"]))
    # A union reports one error per member; keep each (path, message) once.
    return list(dict.fromkeys(problems))


def validate_manifest(data: Any) -> list[Problem]:
    """Problems with one RolloutJob manifest (a parsed YAML document); empty when it is valid."""
    if not isinstance(data, dict):
        return [Problem("", f"expected a mapping (a RolloutJob manifest), got {type(data).__name__}")]
    try:
        RolloutJob.model_validate(data)
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


def validate_text(text: str) -> list[tuple[int, list[Problem]]]:
    """(document index, problems) for every YAML document in `text`; a YAML syntax error is one problem."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        return [(0, [Problem("", f"invalid YAML: {err}")])]
    if not docs:
        return [(0, [Problem("", "no YAML document found")])]
    return [(i, validate_manifest(d)) for i, d in enumerate(docs)]


def validate_file(path: str | Path) -> list[tuple[int, list[Problem]]]:
    return validate_text(Path(path).read_text())
