"""The diagnostics a job runs, resolved from `spec.diagnostics` (tracefleet.contract.job.DiagnosticSpec),
and running them over one session's evidence.

A job without `spec.diagnostics` runs every built-in with action `flag`: findings are recorded in the
batch, nothing else changes. A job that lists diagnostics runs exactly those, each with its action:
a built-in by `name`, a Python hook `module:function` (`hook`), or a program (`command`) that reads the
evidence JSON on stdin (params in the environment variable DIAGNOSTIC_PARAMS_ENV) and prints a JSON list
of hits ({"message", "file", "line", "call_id"}). A diagnostic that fails to run is itself a finding
(severity error, with the job's action): a session nobody could judge is not passed as clean.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
from collections.abc import Iterable, Sequence
from typing import Any

from tracefleet.contract import environment

from tracefleet.diagnostics.base import ACTIONS, EVALUATOR_OUTPUT, Action, Diagnostic, Finding, Hit, SessionFindings
from tracefleet.diagnostics.evidence import SessionEvidence
from tracefleet.diagnostics.library import BUILTINS

DIAGNOSTIC_PARAMS_ENV = environment.DIAGNOSTIC_PARAMS
USER_VERSION = "user"


def _hits(values: Iterable[Any]) -> Iterable[Hit]:
    for v in values or ():
        yield v if isinstance(v, Hit) else Hit.model_validate(v)


def hook_diagnostic(name: str, ref: str) -> Diagnostic:
    """A `module:function` taking (evidence, params) and returning hits (Hit or dicts)."""
    module, _, attr = ref.partition(":")
    fn = getattr(importlib.import_module(module), attr)
    return Diagnostic(name, str(getattr(fn, "version", USER_VERSION)), getattr(fn, "severity", "warning"),
                      lambda ev, params: _hits(fn(ev, params)))


def command_diagnostic(name: str, argv: Sequence[str], timeout_s: float = 60) -> Diagnostic:
    def check(ev: SessionEvidence, params: dict[str, Any]) -> Iterable[Hit]:
        env = {**os.environ, DIAGNOSTIC_PARAMS_ENV: json.dumps(params)}
        proc = subprocess.run(list(argv), input=ev.model_dump_json(), capture_output=True, text=True, timeout=timeout_s, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        out = proc.stdout.strip()
        return _hits(json.loads(out) if out else [])

    return Diagnostic(name, USER_VERSION, "warning", check)


def resolve(spec: Any) -> Diagnostic:
    """The Diagnostic a `spec.diagnostics` entry names."""
    if getattr(spec, "hook", None):
        return hook_diagnostic(spec.name, spec.hook)
    if getattr(spec, "command", None):
        return command_diagnostic(spec.name, spec.command)
    if spec.name not in BUILTINS:
        raise ValueError(f"diagnostic {spec.name!r}: not a built-in ({', '.join(BUILTINS)}); give hook or command")
    return BUILTINS[spec.name]


def configured(specs: Sequence[Any] | None) -> list[tuple[Diagnostic, Action, dict[str, Any]]]:
    """(diagnostic, action, params) for each diagnostic a job runs; None: every built-in, flag only."""
    if specs is None:
        return [(d, "flag", {}) for d in BUILTINS.values()]
    return [(resolve(s), s.action, dict(s.params or {})) for s in specs]


def run_diagnostics(evidence: SessionEvidence, specs: Sequence[Any] | None = None,
                    resolved: list[tuple[Diagnostic, Action, dict[str, Any]]] | None = None) -> SessionFindings:
    findings: list[Finding] = []
    for diag, action, params in resolved if resolved is not None else configured(specs):
        try:
            findings += diag.run(evidence, params, action)
        except Exception as exc:  # noqa: BLE001 - a diagnostic that cannot judge is a finding, not a pass
            findings.append(Finding(name=diag.name, version=diag.version, severity="error", action=action,
                                    message=f"diagnostic failed: {type(exc).__name__}: {exc}"[:500], file=EVALUATOR_OUTPUT))
    return SessionFindings(findings=findings)


UNAVAILABLE = "diagnostics_unavailable"


def unavailable(message: str, resolved: list[tuple[Diagnostic, Action, dict[str, Any]]]) -> SessionFindings:
    """The session's evidence could not be read: one finding with the strongest action the job's
    diagnostics carry (fail closed: a session nobody could judge is not passed as clean)."""
    actions = {a for _, a, _ in resolved}
    if not actions:
        return SessionFindings()
    action = next(a for a in reversed(ACTIONS) if a in actions)
    return SessionFindings(findings=[Finding(name=UNAVAILABLE, version="1", severity="error", action=action,  # type: ignore[arg-type]
                                             message=message[:500], file=EVALUATOR_OUTPUT)])
