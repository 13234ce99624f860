"""Which task the loop's rollouts run next (tracefleet.trainer.task_sampler): `spread` spends groups where a group
can have reward spread, keeps every group whole, and never starves a kind, whatever the kinds' pass rates; `rounds`
is the queue's order. The hook it plugs into (LocalRun.next_session) runs real sessions in the order it picks."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tracefleet.trainer.task_sampler import TaskSampler, base_task, spread_chance

KINDS = {"always": 1.0, "never": 0.0, "half": 0.5, "rare": 0.05}


def queue(tasks_per_kind: int = 10, rounds: int = 5, group: int = 4) -> list[Any]:
    """The loop's planned sessions: every task of every kind, round after round, `group` samples each."""
    plans = []
    for r in range(rounds):
        for kind in KINDS:
            for i in range(tasks_per_kind):
                task = SimpleNamespace(id=f"{kind}-{i}-r{r}", metadata={"kind": kind})
                plans += [SimpleNamespace(task=task, group_id=f"job/{task.id}", sample_index=s) for s in range(group)]
    return plans


def result(plan: Any, reward: float) -> Any:
    return SimpleNamespace(task_id=plan.task.id, task_metadata=plan.task.metadata, status="completed", reward=reward,
                           sample_index=plan.sample_index)


def drive(sampler: TaskSampler, plans: list[Any], groups: int, seed: int = 0) -> list[str]:
    """Start `groups` groups through the sampler, each session finishing before the next starts (its reward drawn
    at its kind's pass rate); the kinds of the groups in the order started."""
    rng = random.Random(seed)
    finished: list[Any] = []
    started: list[str] = []
    current = None
    while plans and len(started) <= groups:
        sampler.observe(finished)
        plan = plans.pop(sampler.next_index(plans))
        if plan.group_id != current:
            assert current is None or not any(p.group_id == current for p in plans), "a group was left unfinished"
            current = plan.group_id
            started.append(plan.task.metadata["kind"])
        finished.append(result(plan, float(rng.random() < KINDS[plan.task.metadata["kind"]])))
    return started[:groups]


def test_spread_never_starves_a_kind_and_spends_groups_where_rewards_can_differ() -> None:
    explore = 0.2
    sampler = TaskSampler("spread", group_size=4, explore=explore, seed=1)
    kinds = drive(sampler, queue(rounds=20), groups=150)
    share = explore / len(KINDS)
    counts: Counter[str] = Counter()
    for n, kind in enumerate(kinds, start=1):
        counts[kind] += 1
        # at every point of the run, every kind has had its share of the groups started, within one pick per kind
        assert all(counts[k] >= share * n - len(KINDS) for k in KINDS), (n, counts)
    # the kind whose groups have spread gets the most; the always- and never-solved kinds little more than their share
    assert counts["half"] == max(counts.values()) and counts["half"] > 0.4 * len(kinds), counts
    assert counts["always"] < 0.2 * len(kinds) and counts["never"] < 0.2 * len(kinds), counts
    rates = sampler.rates.by_kind()
    assert rates["always"]["solved"] == rates["always"]["tried"] and rates["never"]["solved"] == 0
    # what each step of the loop records (loop.jsonl `kinds`): groups started, sessions solved and tried, per kind
    seen = sampler.kinds()
    # (drive starts one group past those it returns, to see the last one whole)
    assert set(seen) == set(KINDS) and all(0 <= seen[k]["groups"] - counts[k] <= 1 for k in KINDS)
    assert seen["half"]["tried"] == rates["half"]["tried"]


def test_no_kind_starves_even_without_exploration_when_every_kind_is_flat() -> None:
    sampler = TaskSampler("spread", group_size=2, explore=0.0, seed=3)
    kinds = drive(sampler, queue(group=2), groups=120)
    # no spread anywhere but "half": the floor still draws the flat kinds now and then
    assert set(kinds) == set(KINDS), Counter(kinds)


def test_rounds_keeps_the_queues_order() -> None:
    plans = queue(tasks_per_kind=2, rounds=1, group=2)
    order = [p.task.id for p in plans]
    sampler = TaskSampler("rounds", group_size=2)
    got = []
    while plans:
        got.append(plans.pop(sampler.next_index(plans)).task.id)
    assert got == order


def test_the_pass_rate_math() -> None:
    assert spread_chance(0.0, 4) == spread_chance(1.0, 4) == 0.0
    assert spread_chance(0.5, 2) == pytest.approx(0.5) and spread_chance(0.5, 4) == pytest.approx(0.875)
    assert base_task("train-003-r12") == "train-003" and base_task("held-r") == "held-r" and base_task("a") == "a"
    with pytest.raises(ValueError, match="explore"):
        TaskSampler("spread", 4, explore=1.5)


JOB = """\
apiVersion: tracefleet.io/v1alpha1
kind: RolloutJob
metadata: {name: order}
spec:
  inference: {external: {baseUrl: "http://127.0.0.1:9", model: m}}
  harness: {command: ["sh", "-c", "true"], sessionTimeoutSeconds: 60}
  tasks:
    samplesPerTask: 2
    inline:
      - {id: a-r0, prompt: a, metadata: {kind: x}}
      - {id: b-r0, prompt: b, metadata: {kind: y}}
      - {id: c-r0, prompt: c, metadata: {kind: x}}
  evaluator: {command: ["sh", "-c", "true"]}
  output: {uri: out, tracesPerBatch: 2}
  parallelism: 1
"""


def test_local_run_starts_the_sessions_the_sampler_picks(tmp_path: Path) -> None:
    from tracefleet.runner.local import LocalOptions, LocalRun

    (tmp_path / "job.yaml").write_text(JOB)
    log = open(tmp_path / "log", "w")  # noqa: SIM115
    run = LocalRun(LocalOptions(job_path=tmp_path / "job.yaml", output=str(tmp_path / "out"),
                                work_dir=tmp_path / "work", netns="off"), out=log, summary=log)
    sampler = TaskSampler("spread", group_size=2, explore=0.0, seed=0)
    picked: list[str] = []

    def next_session(q: list[Any]) -> int:
        sampler.observe([r.result for r in run.results])
        i = sampler.next_index(q)
        picked.append(f"{q[i].task.id}#{q[i].sample_index}")
        return i

    run.next_session = next_session
    with log:
        assert run.run() in (0, 1)  # 1: no session made a model call, so nothing trainable was sealed
    assert sorted(picked) == sorted(f"{t}-r0#{s}" for t in "abc" for s in (0, 1))
    # each group ran whole, in the order the sampler chose
    assert all(picked[i].split("#")[0] == picked[i + 1].split("#")[0] for i in (0, 2, 4))
    assert [f"{r.result.task_id}#{r.result.sample_index}" for r in run.results] == picked
