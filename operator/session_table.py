"""The session table: each session's state read from the observed children only (pure) - which sessions
run, succeeded, failed, wait for a retry, or need a pod now. Nothing here is remembered between reconciles."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterable

from tracefleet.contract.semantics import should_retry
from tracefleet.operator import names as n


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def pod_finished_at(pod: dict[str, Any]) -> float:
    st = pod.get("status") or {}
    times = [
        _ts(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for cs in (st.get("containerStatuses") or []) + (st.get("initContainerStatuses") or [])
    ]
    times += [_ts(c.get("lastTransitionTime")) for c in st.get("conditions") or []]
    times = [t for t in times if t is not None]
    return max(times) if times else (_ts(pod["metadata"].get("creationTimestamp")) or 0.0)


def job_condition(job: dict[str, Any], type_: str) -> bool:
    return any(
        c.get("type") == type_ and c.get("status") == "True" for c in (job.get("status") or {}).get("conditions") or []
    )


@dataclass
class SessionTable:
    total: int
    alive: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # session -> live pods
    harness_ok: set[int] = field(default_factory=set)
    failures: dict[int, int] = field(default_factory=dict)
    last_failure: dict[int, float] = field(default_factory=dict)
    next_attempt: dict[int, int] = field(default_factory=dict)
    eval_ok: set[int] = field(default_factory=set)
    eval_failed: set[int] = field(default_factory=set)
    eval_running: set[int] = field(default_factory=set)
    terminating: int = 0


def observe(total: int, pods: list[dict[str, Any]], eval_jobs: list[dict[str, Any]],
            succeeded: Iterable[int] = ()) -> SessionTable:
    """`succeeded`: sessions whose harness pod succeeded, known without the pod (the harness watch keeps
    them as bits)."""
    t = SessionTable(total=total, harness_ok=set(succeeded))
    for p in pods:
        labels = p["metadata"].get("labels") or {}
        try:
            s = int(labels[n.LABEL_SESSION])
            attempt = int(labels.get(n.LABEL_ATTEMPT, "0"))
        except (KeyError, ValueError):
            continue
        t.next_attempt[s] = max(t.next_attempt.get(s, 0), attempt + 1)
        phase = (p.get("status") or {}).get("phase")
        if phase == "Succeeded":
            t.harness_ok.add(s)
        elif phase == "Failed":
            t.failures[s] = t.failures.get(s, 0) + 1
            t.last_failure[s] = max(t.last_failure.get(s, 0.0), pod_finished_at(p))
        elif p["metadata"].get("deletionTimestamp"):
            t.terminating += 1  # still holds a slot, but was deleted by us (suspend): not a failure
        else:
            t.alive.setdefault(s, []).append(p)
    for j in eval_jobs:
        try:
            s = int((j["metadata"].get("labels") or {})[n.LABEL_SESSION])
        except (KeyError, ValueError):
            continue
        if job_condition(j, "Complete"):
            t.eval_ok.add(s)
        elif job_condition(j, "Failed"):
            t.eval_failed.add(s)
        else:
            t.eval_running.add(s)
    return t


def backoff_s(failures: int, base: float, cap: float) -> float:
    return min(cap, base * (2 ** max(0, failures - 1)))


@dataclass
class Decisions:
    """What the table decides this pass: which sessions are done, which need a pod or an evaluator Job."""

    succeeded: list[int]
    failed: list[int]
    running: int
    need_eval: list[int]
    need_pod: list[tuple[int, int]]  # (session, attempt), in session order, within parallelism
    waiting_retry: int


def decide(
    t: SessionTable,
    *,
    has_evaluator: bool,
    parallelism: int,
    max_retries: int,
    now: float,
    backoff_base_s: float,
    backoff_cap_s: float,
    may_start: bool,
    made_calls: Callable[[int], bool] = lambda s: False,
) -> Decisions:
    """`made_calls(s)`: whether session s's latest failed attempt made a model call; such a failure is
    data and is not retried (tracefleet.contract.semantics.should_retry)."""
    succeeded: list[int] = []
    failed: list[int] = []
    need_eval: list[int] = []
    need_pod: list[tuple[int, int]] = []
    running = 0
    waiting = 0
    slots = parallelism - sum(len(v) for v in t.alive.values()) - t.terminating
    for s in range(t.total):
        if s in t.harness_ok:
            if not has_evaluator or s in t.eval_ok:
                succeeded.append(s)
            elif s in t.eval_failed:
                failed.append(s)  # fail closed: an errored evaluator never yields a reward
            else:
                running += 1
                if s not in t.eval_running:
                    need_eval.append(s)
            continue
        if s in t.alive:
            running += 1
            continue
        fails = t.failures.get(s, 0)
        if fails and not should_retry(model_calls=int(made_calls(s)), retries_done=fails - 1, max_retries=max_retries):
            failed.append(s)
            continue
        if fails and now < t.last_failure.get(s, 0.0) + backoff_s(fails, backoff_base_s, backoff_cap_s):
            waiting += 1
            continue
        if may_start and slots > 0:
            need_pod.append((s, t.next_attempt.get(s, 0)))
            slots -= 1
    return Decisions(succeeded, failed, running, need_eval, need_pod, waiting)
