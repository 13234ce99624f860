"""What a diagnostic is and what it returns.

A diagnostic is a function `(evidence: SessionEvidence, params: dict) -> iterable of Hit` with a name, a
version and a severity. Each hit names where the problem is (a file and line of the workspace diff, a
model call id, or a harness/evaluator stream), so every finding can be checked by a person. The runner
turns hits into `Finding`s (diagnostic name, version, severity, message, evidence, the job's action).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


from tracefleet.contract.diagnostics import (  # noqa: F401 - the findings' models, re-exported for diagnostic authors
    ACTIONS, EVALUATOR_OUTPUT, HARNESS_STDERR, QUARANTINING, Action, Finding, Hit, SessionFindings, Severity,
    quarantined_reward,
)

from tracefleet.diagnostics.evidence import SessionEvidence

Check = Callable[[SessionEvidence, dict[str, Any]], Iterable[Hit]]


@dataclass(frozen=True)
class Diagnostic:
    name: str
    version: str
    severity: Severity
    check: Check
    doc: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)

    def run(self, evidence: SessionEvidence, params: dict[str, Any] | None, action: Action) -> list[Finding]:
        merged = {**self.defaults, **(params or {})}
        return [Finding(**hit.model_dump(), name=self.name, version=self.version, severity=self.severity, action=action)
                for hit in self.check(evidence, merged)]
