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

from .base import Action, Diagnostic
from .evidence import stored_evidence
from .registry import BUILTINS, hook_diagnostic


@dataclass
class DiagnosticReport:
    name: str
    version: str
    sessions: int = 0  # sessions judged (with evidence)
    flagged: list[str] = field(default_factory=list)
    flagged_rewards: list[float] = field(default_factory=list)
    other_rewards: list[float] = field(default_factory=list)
    demoted: int = 0  # flagged sessions with a positive advantage
    demoted_advantage: float = 0.0  # their advantages, summed
    changes: list[float] = field(default_factory=list)  # |advantage change| of the other sessions in flagged groups

    def lines(self) -> list[str]:
        def mean(values: list[float]) -> str:
            return f"{sum(values) / len(values):.3f}" if values else "-"

        change = f"{sum(self.changes) / len(self.changes):.3f}" if self.changes else "-"
        return [
            f"{self.name} (v{self.version}): {len(self.flagged)} of {self.sessions} sessions flagged",
            f"  mean reward flagged {mean(self.flagged_rewards)} vs not {mean(self.other_rewards)}",
            f"  positive-advantage sessions demoted: {self.demoted} (advantage {self.demoted_advantage:+.3f} in all)",
            f"  mean |advantage change| of the other sessions in their groups: {change}",
            *[f"  flagged: {s}" for s in self.flagged],
        ]


def selected(names: Sequence[str] | None) -> list[tuple[Diagnostic, Action, dict[str, Any]]]:
    """Built-ins by name, hooks as module:function; none given: every built-in."""
    out: list[tuple[Diagnostic, Action, dict[str, Any]]] = []
    for name in names or list(BUILTINS):
        if ":" in name:
            out.append((hook_diagnostic(name.rpartition(":")[2], name), "quarantine", {}))
        elif name in BUILTINS:
            out.append((BUILTINS[name], "quarantine", {}))
        else:
            raise SystemExit(f"--diagnostic {name!r}: not a built-in ({', '.join(BUILTINS)}) nor module:function")
    return out


def backtest(reader: Any, diagnostics: list[tuple[Diagnostic, Action, dict[str, Any]]]) -> tuple[list[DiagnosticReport], int, int]:
    """(one report per diagnostic, sessions read, sessions without evidence)."""
    reports = [DiagnosticReport(d.name, d.version) for d, _, _ in diagnostics]
    sessions = missing = 0
    for seq in reader.seqs():
        table = reader.read(seq).training_table()
        ids = table.column("session_id").to_pylist()
        groups = table.column("group_id").to_pylist()
        rewards = [0.0 if r is None else float(r) for r in table.column("reward").to_pylist()]
        before = group_advantages(rewards, groups, ids)
        first = {s: i for i, s in reversed(list(enumerate(ids)))}  # a session's first row
        evidence = {}
        for sid in first:
            sessions += 1
            ev = stored_evidence(reader.bucket, reader.job, sid)
            if ev is None:
                missing += 1
            else:
                evidence[sid] = ev
        for (diag, _action, params), report in zip(diagnostics, reports, strict=True):
            flagged = set()
            for sid, ev in evidence.items():
                report.sessions += 1
                hits = list(diag.check(ev, {**diag.defaults, **params}))
                (report.flagged_rewards if hits else report.other_rewards).append(rewards[first[sid]])
                if hits:
                    flagged.add(sid)
                    report.flagged.append(sid)
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
    return reports, sessions, missing


