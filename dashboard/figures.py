"""The figures the pages show, computed from manifests (a job's counts, its reward per batch) and, once the
background reader has them, from batch rows (groups with signal, per task success, fail-closed reasons).

The names of a loop's figures are loop.jsonl's own keys (tracefleet.trainer.loop.step_record), the names the
trackers (tracefleet.dashboard.trackers: TensorBoard, MLflow) write them under.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tracefleet.contract.batch import BatchManifest

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
    last_sealed_at: float = 0.0


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
        f.last_sealed_at = max(f.last_sealed_at, m.created_at)
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


def loop_series(steps: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """Each LOOP_FIGURES curve, one value per step (the signal share from the step's group counts)."""
    out: dict[str, list[float | None]] = {}
    for key, _ in LOOP_FIGURES:
        if key == "signal_share":
            out[key] = [s["groups_with_signal"] / s["groups"] if s.get("groups") else None for s in steps]
        else:
            out[key] = [s.get(key) for s in steps]
    return out
