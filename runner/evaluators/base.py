"""What every evaluator takes and returns. Evaluators fail closed: any error or timeout is reward 0
with the outcome saying why, never an exception that loses the session."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tracefleet.contract.session import EvalOutcome, EvalStatus, EvaluatorSpec, Task
from tracefleet.runner.workspace import PreparedWorkspace

__all__ = ["EvalContext", "EvalOutcome", "EvalStatus", "EvaluatorSpec", "RunnableEvaluator", "tail"]


@dataclass
class EvalContext:
    task: Task
    workspace: PreparedWorkspace
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


class RunnableEvaluator(Protocol):
    """What judges a session, built from its plan's EvaluatorSpec (spec.evaluator, tracefleet.contract.job.Evaluator,
    is what the job asks for)."""

    def evaluate(self, ctx: EvalContext) -> EvalOutcome: ...


def tail(path: Path | None, limit: int = 2000) -> str:
    if path is None or not path.exists():
        return ""
    data = path.read_bytes()
    return data[-limit:].decode(errors="replace")
