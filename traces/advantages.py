"""GRPO group-relative advantages.

A group is the set of sessions sampled for one task (`group_id`); each session has one reward. A session
can yield several traces (prefix-merge splits at compaction, sub-agents, drift): all of them get the
session's advantage, and the group statistics count each session once.

- GRPO: A = (r - mean_g) / (std_g + eps)  (population std; `normalize_std=False` gives r - mean_g)
- leave-one-out (RLOO): A = r - mean of the *other* sessions in the group, optionally / (std_g + eps)

Sessions alone in their group (or in a group whose rewards are all equal) get advantage 0: a group left with
fewer than two valid samples trains nothing. A missing reward counts as 0 (fail-closed sessions already carry a
reward <= 0). Which rows are valid samples is the caller's: `BatchReader` passes only its `training_table()`,
without the rows the infrastructure failed or a diagnostic quarantined (tracefleet.contract.semantics), so their
reward <= 0 moves no baseline. Seal a whole group in one batch (the runner does) so the statistics see every
sample.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def group_advantages(
    rewards: Sequence[float | None] | np.ndarray,
    group_ids: Sequence[str | None],
    session_ids: Sequence[str | None] | None = None,
    *,
    leave_one_out: bool = False,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:
    """One advantage per trace (float32)."""
    n = len(group_ids)
    r = np.array([0.0 if v is None or v != v else float(v) for v in rewards], dtype=np.float64)
    sessions = list(session_ids) if session_ids is not None else [str(i) for i in range(n)]
    out = np.zeros(n, dtype=np.float64)
    members: dict[str, dict[str, list[int]]] = {}
    for i, (g, s) in enumerate(zip(group_ids, sessions, strict=True)):
        key = g if g is not None else f"\0trace-{i}"  # no group: a group of one
        members.setdefault(key, {}).setdefault(s if s is not None else f"\0{i}", []).append(i)
    for by_session in members.values():
        rows = list(by_session.values())
        k = len(rows)
        if k < 2:
            continue
        sr = np.array([r[idx[0]] for idx in rows])
        mean = sr.mean()
        std = sr.std()
        if leave_one_out:
            adv = (sr - mean) * (k / (k - 1))  # == r_i - mean(r_{-i})
        else:
            adv = sr - mean
        if normalize_std:
            adv = adv / (std + eps) if std > 0 else np.zeros_like(adv)
        for idx, a in zip(rows, adv, strict=True):
            out[idx] = a
    return out.astype(np.float32)
