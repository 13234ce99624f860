"""What every evaluator takes and returns. Evaluators fail closed: any error or timeout is reward 0
with the outcome saying why, never an exception that loses the session."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from tracefleet.runner.task import Task
from tracefleet.runner.workspace import Workspace

# ok: the evaluator ran and judged (reward may still be 0); the rest are failures of the judging.
EvalStatus = Literal["ok", "error", "timeout", "patch_failed", "skipped"]


class EvaluatorSpec(BaseModel):
    """How to judge a session. `type` picks the evaluator; the other fields are per type."""

    model_config = ConfigDict(extra="allow")

    type: Literal["command", "tests", "python", "none"] = "tests"
    command: str | list[str] | None = None  # command: shell string or argv; tests: the test command
    entrypoint: str | None = None  # python: "module:function" or an entry point name
    timeout_s: float = 300
    live_workspace: bool = False  # command: judge the harness's live workspace instead of a fresh copy
    env: dict[str, str] = Field(default_factory=dict)


class EvalOutcome(BaseModel):
    reward: float = 0.0
    status: EvalStatus = "ok"
    message: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def failed_closed(self) -> bool:
        return self.status != "ok"


@dataclass
class EvalContext:
    task: Task
    workspace: Workspace
    patch: str
    session_dir: Path
    harness_exit_code: int | None
    harness_stdout: Path | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "task": self.task.model_dump(mode="json", by_alias=False),
                "patch": self.patch,
                "original": str(self.workspace.original),
                "workdir": str(self.workspace.workdir),
                "base_commit": self.workspace.base_commit,
                "session_dir": str(self.session_dir),
                "harness_exit_code": self.harness_exit_code,
                "harness_stdout": str(self.harness_stdout) if self.harness_stdout else None,
                "metadata": self.metadata,
            }
        )


class Evaluator(Protocol):
    def evaluate(self, ctx: EvalContext) -> EvalOutcome: ...


def tail(path: Path | None, limit: int = 2000) -> str:
    if path is None or not path.exists():
        return ""
    data = path.read_bytes()
    return data[-limit:].decode(errors="replace")
