"""Diagnostics as data: the built-in names a RolloutJob may name (`spec.diagnostics[].name`) and the findings
a diagnostic writes, which travel with a session's rows in sealed batches and in overlays
(tracefleet.diagnostics implements the checks; tracefleet.traces applies the findings when reading).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

# The built-in diagnostics by name (tracefleet.diagnostics.library implements each; a test checks both lists agree).
BUILTIN_DIAGNOSTICS: tuple[str, ...] = (
    "protected_files", "test_skipping", "runner_bypass", "success_without_work", "failure_rewarded", "tool_loop",
    "runaway_output", "off_policy",
)

Severity = Literal["info", "warning", "error"]
Action = Literal["flag", "quarantine", "drop"]
ACTIONS: tuple[Action, ...] = ("flag", "quarantine", "drop")  # weakest first
# flag: recorded only. quarantine: sealed with the finding, reward forced to <= 0, and left out of
# training and of GRPO group statistics by default (tracefleet.traces.reader). drop: the session's
# token rows are not sealed; one row without tokens keeps the finding and the group whole (counted).
# The same rules whether a session is judged at sealing or by an overlay later (tracefleet.traces.overlay).
QUARANTINING: tuple[Action, ...] = ("quarantine", "drop")  # the actions that leave a session out of training


def quarantined_reward(reward: float | None) -> float | None:
    """A quarantined session's reward: never positive (a trainer that includes it promotes nothing)."""
    return None if reward is None else min(reward, 0.0)

# Where a finding points when it is not a file or a call.
HARNESS_STDERR = "harness.stderr"
EVALUATOR_OUTPUT = "evaluator"


class Hit(BaseModel):
    """One problem a diagnostic found: a message and where (at least one of file, call_id)."""

    message: str
    file: str | None = None
    line: int | None = None
    call_id: str | None = None

    @model_validator(mode="after")
    def _has_evidence(self) -> Hit:
        if self.file is None and self.call_id is None:
            raise ValueError(f"finding {self.message!r} names no evidence: give a file (and line) or a call_id")
        return self


class Finding(Hit):
    name: str  # the diagnostic's
    version: str
    severity: Severity
    action: Action = "flag"


class SessionFindings(BaseModel):
    """Every finding of one session and what they decide."""

    findings: list[Finding] = Field(default_factory=list)

    @property
    def action(self) -> Action | None:
        """The strongest action any finding carries (drop > quarantine > flag), None without findings."""
        acts = {f.action for f in self.findings}
        return next((a for a in reversed(ACTIONS) if a in acts), None)

    @property
    def quarantined(self) -> bool:
        return self.action in QUARANTINING
