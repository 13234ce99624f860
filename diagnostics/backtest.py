"""Backtest: re-run diagnostics over a job's sealed batches and the session evidence kept in the bucket,
without rewriting anything, and say what they would have changed for a GRPO trainer.

Per diagnostic: sessions flagged (of those with evidence), mean sealed reward of flagged vs other
sessions, how many flagged sessions had a positive advantage (the trainer promoted them; quarantine
would leave them out) and their total advantage, and the mean absolute change of the other sessions'
advantages in the flagged sessions' groups once the flagged ones leave the group statistics. The
batches are read as a trainer reads them (BatchReader's training table: auxiliary and already
quarantined rows left out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracefleet.traces.advantages import group_advantages

from tracefleet.traces.overlay import Overlay

from tracefleet.diagnostics.base import Action, Diagnostic, Finding
from tracefleet.diagnostics.evidence import SessionEvidence, stored_evidence
from tracefleet.diagnostics.registry import BUILTINS, hook_diagnostic


@dataclass
class DiagnosticReport:
    name: str
    version: str
    action: Action = "quarantine"
    sessions: int = 0  # sessions judged (with evidence)
    flagged: list[str] = field(default_factory=list)
    findings: dict[str, list[Finding]] = field(default_factory=dict)  # flagged session -> its findings
    flagged_rewards: list[float] = field(default_factory=list)
    other_rewards: list[float] = field(default_factory=list)
    demoted: int = 0  # flagged sessions with a positive advantage
    demoted_advantage: float = 0.0  # their advantages, summed
    changes: list[float] = field(default_factory=list)  # |advantage change| of the other sessions in flagged groups

    def lines(self) -> list[str]:
        return [
            f"{self.name} (v{self.version}): {len(self.flagged)} of {self.sessions} sessions flagged",
            f"  mean reward flagged {mean_text(self.flagged_rewards)} vs not {mean_text(self.other_rewards)}",
            f"  positive-advantage sessions demoted: {self.demoted} (advantage {self.demoted_advantage:+.3f} in all)",
            f"  mean |advantage change| of the other sessions in their groups: {mean_text(self.changes)}",
            *[f"  flagged: {s}" for s in self.flagged],
        ]

    def overlay(self, job: str, seqs: list[int]) -> Overlay:
        """The verdicts as an overlay the reader applies (tracefleet.traces.overlay)."""
        return Overlay(job=job, diagnostic=self.name, version=self.version, action=self.action, seqs=seqs,
                       judged=self.sessions,
                       sessions={s: [f.model_dump(mode="json") for f in found] for s, found in self.findings.items()})


def mean_text(values: list[float]) -> str:
    return f"{sum(values) / len(values):.3f}" if values else "-"


@dataclass
class Backtest:
    reports: list[DiagnosticReport]
    seqs: list[int]
    sessions: int = 0  # sealed sessions read
    missing: int = 0  # of those, without evidence (not judged)
    evidence: dict[str, SessionEvidence] = field(default_factory=dict)  # flagged sessions' evidence
    rewards: dict[str, float] = field(default_factory=dict)  # sealed reward by session
    advantages: dict[str, float] = field(default_factory=dict)  # GRPO advantage by session, as sealed


def selected(names: Sequence[str] | None, action: Action = "quarantine") -> list[tuple[Diagnostic, Action, dict[str, Any]]]:
    """Built-ins by name, hooks as module:function; none given: every built-in."""
    out: list[tuple[Diagnostic, Action, dict[str, Any]]] = []
    for name in names or list(BUILTINS):
        if ":" in name:
            try:
                out.append((hook_diagnostic(name.rpartition(":")[2], name), action, {}))
            except (ImportError, AttributeError, ValueError) as exc:
                raise SystemExit(f"--diagnostic {name!r}: cannot load the hook: {type(exc).__name__}: {exc}") from None
        elif name in BUILTINS:
            out.append((BUILTINS[name], action, {}))
        else:
            raise SystemExit(f"--diagnostic {name!r}: not a built-in ({', '.join(BUILTINS)}) nor module:function")
    return out


def backtest(reader: Any, diagnostics: list[tuple[Diagnostic, Action, dict[str, Any]]]) -> Backtest:
    """Every diagnostic over every sealed session with evidence. `reader` should read the sealed data
    alone (BatchReader(..., overlays=False)): a backtest says what a diagnostic changes against what was
    sealed, not against earlier overlays."""
    result = Backtest(reports=[DiagnosticReport(d.name, d.version, action) for d, action, _ in diagnostics],
                      seqs=reader.seqs())
    for seq in result.seqs:
        table = reader.read(seq).training_table()
        ids = table.column("session_id").to_pylist()
        groups = table.column("group_id").to_pylist()
        rewards = [0.0 if r is None else float(r) for r in table.column("reward").to_pylist()]
        before = group_advantages(rewards, groups, ids)
        first = {s: i for i, s in reversed(list(enumerate(ids)))}  # a session's first row
        evidence = {}
        for sid, i in first.items():
            result.sessions += 1
            result.rewards[sid], result.advantages[sid] = rewards[i], float(before[i])
            ev = stored_evidence(reader.bucket, reader.job, sid)
            if ev is None:
                result.missing += 1
            else:
                evidence[sid] = ev
        for (diag, action, params), report in zip(diagnostics, result.reports, strict=True):
            flagged = set()
            for sid, ev in evidence.items():
                report.sessions += 1
                try:
                    found = diag.run(ev, params, action)
                except Exception as exc:  # a user's hook: say on which session (the traceback stays chained)
                    raise RuntimeError(f"{diag.name} failed on session {sid}: {type(exc).__name__}: {exc}") from exc
                (report.flagged_rewards if found else report.other_rewards).append(rewards[first[sid]])
                if found:
                    flagged.add(sid)
                    report.flagged.append(sid)
                    report.findings[sid] = found
                    result.evidence[sid] = ev
                    if before[first[sid]] > 0:
                        report.demoted += 1
                        report.demoted_advantage += float(before[first[sid]])
            if not flagged:
                continue
            keep = [i for i, s in enumerate(ids) if s not in flagged]
            after = group_advantages([rewards[i] for i in keep], [groups[i] for i in keep], [ids[i] for i in keep])
            touched = {groups[first[s]] for s in flagged}
            seen = set()
            for k, i in enumerate(keep):
                if groups[i] in touched and ids[i] not in seen:
                    seen.add(ids[i])
                    report.changes.append(abs(float(after[k]) - float(before[i])))
    return result
