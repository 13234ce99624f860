"""The figures the pages show, computed from manifests (a job's counts, its reward per batch) and, once the
background reader has them, from batch rows (groups with signal, per task success, fail-closed reasons).

The names of a loop's figures are loop.jsonl's own keys (tracefleet.trainer.loop.step_record), the names the
trackers (tracefleet.dashboard.trackers: TensorBoard, MLflow) write them under.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tracefleet.contract.batch import BatchManifest
from tracefleet.contract.semantics import OutcomeCounts, OutcomeKind, outcome_counts

# (loop.jsonl key, what the page calls it): the per-step curves of a training loop
LOOP_FIGURES: tuple[tuple[str, str], ...] = (
    ("reward_mean", "mean reward of the step's batch"),
    ("signal_share", "share of groups with signal"),
    ("loss", "loss"),
    ("clipped_share", "clip share"),
    ("mean_abs_dlogprob", "train/inference mismatch (mean |dlogprob|)"),
    ("sync_s", "weight sync seconds"),
    ("paused_s", "generation paused seconds"),
    ("stale_tokens_masked", "stale tokens masked"),
)


@dataclass
class JobFigures:
    batches: int = 0
    sessions: int = 0
    traces: int = 0
    groups: int = 0
    tokens: int = 0
    trainable_tokens: int = 0
    fail_closed: int = 0
    positive: int = 0
    quarantined: int = 0
    dropped: int = 0
    quarantines: Counter[str] = field(default_factory=Counter)  # by diagnostic: sessions quarantined
    findings: Counter[str] = field(default_factory=Counter)  # by diagnostic: findings
    seqs: list[int] = field(default_factory=list)
    reward_mean: list[float | None] = field(default_factory=list)  # per batch, over its sessions
    rewarded: list[int] = field(default_factory=list)  # per batch: its sessions with a reward
    last_sealed_at: float = 0.0
    # by whose outcome (tracefleet.contract.semantics.OutcomeKind); None: sealed before outcome kinds
    outcomes: OutcomeCounts | None = None

    @property
    def mean_reward(self) -> float | None:
        """Over every sealed session with a reward (each batch's mean, weighted by its sessions)."""
        n = sum(k for k, m in zip(self.rewarded, self.reward_mean, strict=True) if m is not None)
        return sum(k * m for k, m in zip(self.rewarded, self.reward_mean, strict=True) if m is not None) / n if n else None

    @property
    def success_rate(self) -> float | None:
        """The share of sealed sessions with reward > 0."""
        return self.positive / self.sessions if self.sessions else None


def job_figures(manifests: list[BatchManifest]) -> JobFigures:
    f = JobFigures()
    for m in manifests:
        f.batches += 1
        f.sessions += m.sessions
        f.traces += m.traces
        f.groups += m.groups
        f.tokens += m.tokens
        f.trainable_tokens += m.trainable_tokens
        f.fail_closed += m.reward.fail_closed
        f.positive += m.reward.positive
        f.quarantined += m.quarantined_sessions
        f.dropped += m.dropped_sessions
        for name, d in m.diagnostics.items():
            f.quarantines[name] += d.quarantined
            f.findings[name] += d.findings
        f.seqs.append(m.seq)
        f.reward_mean.append(m.reward.mean)
        f.rewarded.append(m.reward.sessions)
        f.last_sealed_at = max(f.last_sealed_at, m.created_at)
        if m.outcome_kinds:
            f.outcomes = outcome_counts(m) + (f.outcomes or OutcomeCounts())
    return f


def sessions_of(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One entry per session (its first row), in row order, with its traces' ids."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        s = out.setdefault(r["session_id"], {**r, "traces": []})
        s["traces"].append(r["trace_id"])
    return out


def signal_share(rows: list[dict[str, Any]]) -> float | None:
    """The share of a batch's groups whose sessions' rewards differ (their GRPO advantages are not all 0)."""
    groups: dict[str, set[float]] = {}
    for s in sessions_of(rows).values():
        if s.get("group_id") is not None:
            groups.setdefault(s["group_id"], set()).add(s.get("reward") or 0.0)
    return sum(len(v) > 1 for v in groups.values()) / len(groups) if groups else None


@dataclass
class GroupSpread:
    seq: int
    group_id: str
    task_id: str
    sessions: int
    rewards: list[float]  # of its sessions the infrastructure did not fail, sorted
    std: float | None  # their population standard deviation (0: no learning signal)

    @property
    def signal(self) -> bool:
        return bool(self.std)


def group_spread(rows_by_seq: dict[int, list[dict[str, Any]]]) -> list[GroupSpread]:
    """Each group of the batches read (oldest first): its rewards and their spread, without the infrastructure's
    sessions (left out of the group's statistics: tracefleet.contract.semantics.OutcomeKind)."""
    out = []
    for seq in sorted(rows_by_seq):
        groups: dict[str, list[dict[str, Any]]] = {}
        for s in sessions_of(rows_by_seq[seq]).values():
            if s.get("group_id") is not None:
                groups.setdefault(s["group_id"], []).append(s)
        for gid, members in groups.items():
            counted = [s for s in members if s.get("outcome_kind") != OutcomeKind.INFRASTRUCTURE]
            rewards = sorted(float(s.get("reward") or 0.0) for s in counted)
            mean = sum(rewards) / len(rewards) if rewards else None
            std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if mean is not None else None
            out.append(GroupSpread(seq, gid, members[0].get("task_id") or "-", len(members), rewards, std))
    return out


def task_success(rows_by_seq: dict[int, list[dict[str, Any]]], seqs: list[int]) -> dict[str, list[float | None]]:
    """Per task: the share of its sessions with reward > 0 in each batch (None where the batch has none)."""
    tasks: dict[str, list[float | None]] = {}
    for i, seq in enumerate(seqs):
        per: dict[str, list[float]] = {}
        for s in sessions_of(rows_by_seq.get(seq, [])).values():
            per.setdefault(s.get("task_id") or "-", []).append(1.0 if (s.get("reward") or 0) > 0 else 0.0)
        for task, wins in per.items():
            tasks.setdefault(task, [None] * len(seqs))[i] = sum(wins) / len(wins)
    return dict(sorted(tasks.items()))


def fail_closed_reasons(rows_by_seq: dict[int, list[dict[str, Any]]]) -> Counter[str]:
    """Sessions by fail-closed reason."""
    out: Counter[str] = Counter()
    for rows in rows_by_seq.values():
        for s in sessions_of(rows).values():
            out.update(set(s.get("fail_closed_reasons") or ()))
    return out


def figure(value: Any) -> float | int | None:
    """A value as a figure to show or plot: a finite number, else None (a loop.jsonl line may hold `Infinity`,
    NaN or a string where a number belongs; none of them is a point)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return value


def loop_series(steps: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """Each LOOP_FIGURES curve, one value per step (the signal share from the step's group counts)."""
    out: dict[str, list[float | None]] = {}
    for key, _ in LOOP_FIGURES:
        if key == "signal_share":
            out[key] = [_share(s.get("groups_with_signal"), s.get("groups")) for s in steps]
        else:
            out[key] = [figure(s.get(key)) for s in steps]
    return out


def _share(part: Any, whole: Any) -> float | None:
    part, whole = figure(part), figure(whole)
    return part / whole if part is not None and whole else None
