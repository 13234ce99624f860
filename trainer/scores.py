"""What the loop scores: each set's per-session rewards at each checkpoint, the means with their standard errors,
and gains paired over the same sessions.

A set (a held-out job, or the job's own last tasks) runs the same tasks at every checkpoint (policy 0, after the
warm start, after RL), one session per task and sample, keyed `<task id>#<sample>`: a gain between two checkpoints
is the mean of the per-key differences, and its standard error that of those differences (paired), which is
smaller than the unpaired one when the same tasks are easy or hard at both.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CHECKPOINTS = ("before", "warm", "after")  # policy 0, after the warm start, after RL


def session_key(task_id: str, sample_index: int) -> str:
    return f"{task_id}#{sample_index}"


def mean_se(values: Sequence[float]) -> tuple[float | None, float | None]:
    """(mean, standard error of the mean); the error None under two values."""
    if not values:
        return None, None
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None)


def paired_gain(before: Mapping[str, float], after: Mapping[str, float]) -> tuple[float | None, float | None, int]:
    """(mean of after - before over the keys both have, its standard error, how many keys)."""
    keys = sorted(before.keys() & after.keys())
    gain, se = mean_se([after[k] - before[k] for k in keys])
    return gain, se, len(keys)


@dataclass
class SetScores:
    """One scored set: `rewards[checkpoint][key]` per session, `kinds[key]` the task's kind (metadata.kind)."""

    name: str
    path: str
    rewards: dict[str, dict[str, float]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)

    def add(self, checkpoint: str, results: Sequence[Any]) -> None:
        """The finished sessions (SessionResult) of one scoring."""
        from tracefleet.trainer.task_sampler import task_kind

        got = self.rewards.setdefault(checkpoint, {})
        for r in results:
            key = session_key(r.task_id, r.sample_index)
            got[key] = float(r.reward)
            self.kinds[key] = task_kind(r.task_metadata)

    def point(self, checkpoint: str) -> tuple[float | None, float | None, int]:
        """(mean reward, its standard error, sessions) at `checkpoint`."""
        values = list(self.rewards.get(checkpoint, {}).values())
        mean, se = mean_se(values)
        return mean, se, len(values)

    def gain(self, start: str, end: str) -> tuple[float | None, float | None, int]:
        return paired_gain(self.rewards.get(start, {}), self.rewards.get(end, {}))

    def by_kind(self, checkpoint: str) -> dict[str, tuple[int, int]]:
        """Per kind: (sessions rewarded, sessions) at `checkpoint`."""
        out: dict[str, list[int]] = {}
        for key, reward in self.rewards.get(checkpoint, {}).items():
            counts = out.setdefault(self.kinds.get(key, "-"), [0, 0])
            counts[0] += int(reward > 0)
            counts[1] += 1
        return {k: (v[0], v[1]) for k, v in sorted(out.items())}

    def summary(self) -> dict[str, Any]:
        """JSON: each checkpoint's mean, error, sessions and kinds; the paired gains of the warm start and RL."""
        points = {c: dict(zip(("mean", "se", "n"), self.point(c), strict=True)) | {"kinds": self.by_kind(c)}
                  for c in CHECKPOINTS if c in self.rewards}
        gains = {f"{a}->{b}": dict(zip(("gain", "se", "n"), self.gain(a, b), strict=True))
                 for a, b in (("before", "warm"), ("warm", "after"), ("before", "after"))
                 if a in self.rewards and b in self.rewards}
        return {"name": self.name, "path": self.path, "points": points, "gains": gains}


def line(value: tuple[float | None, float | None, int], signed: bool = False) -> str:
    """`0.25 ±0.06` (the standard error), `-` when nothing was scored."""
    mean, se = value[0], value[1]
    if mean is None:
        return "-"
    text = f"{mean:+.2f}" if signed else f"{mean:.2f}"
    return text + (f" ±{se:.2f}" if se is not None else "")
