"""Which task the loop's rollouts run next: in rounds (every task in turn), or where a group can have reward spread.

GRPO learns only from a group whose rewards differ. A task the policy always solves, or never does, gives a flat
group: its sessions cost a whole rollout each and add nothing to the gradient. `--task-sampling spread` tracks the
pass rate of every task and of every kind (the task's `metadata.kind`; one kind for a job without kinds) from the
rollouts as they finish, and starts the next group on a task drawn with weight

    P(spread) = 1 - p^G - (1 - p)^G      (G the group size, p the task's estimated pass rate)

plus a floor (`SPREAD_FLOOR`), so a task predicted flat is drawn rarely, never dropped. A task's rate starts at
its kind's (`PRIOR` pseudo-sessions of it), so an untried task of a kind that is sometimes solved is tried
early; a kind's rate is over its latest `KIND_WINDOW` sessions, as the policy moves. No kind starves: whenever a
kind has been given less than `explore / kinds` of the groups started so far, the next group is that kind's
(the kind with the smallest share first, a task of it drawn uniformly).

A group is kept whole: once one of its sessions started, its others run before any new group (the sink seals whole
groups; GRPO's statistics need every sample). Retries keep their place the same way.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

TaskSampling = Literal["rounds", "spread"]
TASK_SAMPLINGS: tuple[TaskSampling, ...] = ("rounds", "spread")
DEFAULT_EXPLORE = 0.25  # at least this share of the groups is spread over the kinds evenly
SPREAD_FLOOR = 0.02  # the weight of a task predicted flat: deprioritised, never dropped
PRIOR = 2.0  # pseudo-sessions at its kind's rate a task's own rate starts from
KIND_WINDOW = 32  # a kind's rate is over its latest sessions (the policy changes as it trains)
NO_KIND = "-"  # the one kind of a job whose tasks name none
ROUND_SEP = "-r"  # the loop's repeated task ids: <task id>-r<round> (tracefleet.trainer.loop.repeated_job)


def base_task(task_id: str) -> str:
    """The job's task id of a repeated task (`<task id>-r<round>`)."""
    head, sep, tail = task_id.rpartition(ROUND_SEP)
    return head if sep and tail.isdigit() else task_id


def task_kind(metadata: dict[str, Any] | None) -> str:
    kind = (metadata or {}).get("kind")
    return str(kind) if kind else NO_KIND


def spread_chance(p: float, group: int) -> float:
    """The chance that a group of `group` sessions of a task solved with probability `p` has reward spread."""
    return 1.0 - p ** group - (1.0 - p) ** group


@dataclass
class PassRates:
    """Each task's and each kind's sessions so far: (solved, tried), a session solved when its reward is > 0."""

    tasks: dict[str, list[int]] = field(default_factory=dict)  # task id -> [solved, tried]
    kinds: dict[str, deque[int]] = field(default_factory=dict)  # kind -> its latest KIND_WINDOW outcomes (1/0)
    totals: dict[str, list[int]] = field(default_factory=dict)  # kind -> [solved, tried] over the whole run

    def add(self, task: str, kind: str, solved: bool) -> None:
        counts = self.tasks.setdefault(task, [0, 0])
        counts[0] += int(solved)
        counts[1] += 1
        self.kinds.setdefault(kind, deque(maxlen=KIND_WINDOW)).append(int(solved))
        total = self.totals.setdefault(kind, [0, 0])
        total[0] += int(solved)
        total[1] += 1

    def kind_rate(self, kind: str) -> float:
        """The kind's pass rate over its latest sessions, Laplace-smoothed (0.5 before any)."""
        window = self.kinds.get(kind, ())
        return (sum(window) + 1.0) / (len(window) + 2.0)

    def task_rate(self, task: str, kind: str) -> float:
        solved, tried = self.tasks.get(task, (0, 0))
        return (solved + PRIOR * self.kind_rate(kind)) / (tried + PRIOR)

    def by_kind(self) -> dict[str, dict[str, float | int]]:
        """Per kind over the run: solved, tried, and the windowed rate the sampler uses."""
        return {k: {"solved": s, "tried": n, "rate": round(self.kind_rate(k), 3)}
                for k, (s, n) in sorted(self.totals.items())}


class TaskSampler:
    """The next session of the loop's queue of planned sessions (`next_index`), learning pass rates from the
    finished ones (`observe`). `sampling` "rounds": the queue's order (every task in turn, round after round);
    "spread": the module docstring's rule."""

    def __init__(self, sampling: TaskSampling, group_size: int, explore: float = DEFAULT_EXPLORE, seed: int = 0) -> None:
        if sampling not in TASK_SAMPLINGS:
            raise ValueError(f"task sampling {sampling!r}: one of {', '.join(TASK_SAMPLINGS)}")
        if not 0.0 <= explore <= 1.0:
            raise ValueError("explore must be between 0 and 1")
        self.sampling, self.group_size, self.explore = sampling, group_size, explore
        self.rng = random.Random(seed)
        self.rates = PassRates()
        self.started_groups: set[str] = set()
        self.groups_by_kind: Counter[str] = Counter()
        self._observed = 0

    def observe(self, results: Sequence[Any]) -> None:
        """The finished sessions (SessionResult) of the run so far, in the order they finished: the new ones
        since the last call are counted (a stopped session is not an outcome)."""
        for r in results[self._observed:]:
            if r.status != "stopped":
                self.rates.add(base_task(r.task_id), task_kind(r.task_metadata), r.reward > 0)
        self._observed = len(results)

    def next_index(self, queue: Sequence[Any]) -> int:
        """The index in `queue` (SessionPlans) of the session to start now."""
        started = next((i for i, p in enumerate(queue) if p.group_id in self.started_groups), None)
        if started is not None:
            return started
        index = 0 if self.sampling == "rounds" else self._new_group(queue)
        plan = queue[index]
        self.started_groups.add(plan.group_id)
        self.groups_by_kind[task_kind(plan.task.metadata)] += 1
        return index

    def _new_group(self, queue: Sequence[Any]) -> int:
        first: dict[str, int] = {}  # each task's earliest group in the queue (its lowest round)
        kind_of: dict[str, str] = {}
        for i, plan in enumerate(queue):
            task = base_task(plan.task.id)
            if task not in first:
                first[task], kind_of[task] = i, task_kind(plan.task.metadata)
        tasks = list(first)
        kind = self.starved_kind(set(kind_of.values()))
        if kind is not None:
            return first[self.rng.choice([t for t in tasks if kind_of[t] == kind])]
        weights = [spread_chance(self.rates.task_rate(t, kind_of[t]), self.group_size) + SPREAD_FLOOR for t in tasks]
        return first[self.rng.choices(tasks, weights=weights)[0]]

    def kinds(self) -> dict[str, dict[str, float | int]]:
        """Per kind: the groups started, and its sessions solved and tried (PassRates.by_kind)."""
        rates = self.rates.by_kind()
        return {k: {"groups": self.groups_by_kind[k], **rates.get(k, {"solved": 0, "tried": 0, "rate": 0.5})}
                for k in sorted(set(rates) | set(self.groups_by_kind))}

    def starved_kind(self, kinds: set[str]) -> str | None:
        """The kind (of those that still have tasks) given less than its share `explore / kinds` of the groups
        started so far, the one with the fewest first; None when none is."""
        total = sum(self.groups_by_kind.values())
        share = self.explore / len(kinds) if kinds else 0.0
        behind = [k for k in sorted(kinds) if self.groups_by_kind[k] < share * (total + 1)]
        return min(behind, key=lambda k: self.groups_by_kind[k]) if behind else None
