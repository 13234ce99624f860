"""The harness pods as the watch keeps them: the session table sees the same as from a full list, with
succeeded sessions as bits and nothing kept of finished pods but those bits and the failed ones."""

from __future__ import annotations

from tracefleet.operator import names as n
from tracefleet.operator.harness_watch import JobPods, SessionBits, apply_event
from tracefleet.operator.session_table import decide, observe


def pod(session: int, attempt: int, phase: str | None, job: str = "j") -> dict:
    labels = {n.LABEL_JOB: job, n.LABEL_SESSION: str(session), n.LABEL_ATTEMPT: str(attempt)}
    status = {"phase": phase} if phase else {}
    if phase == "Failed":
        status["containerStatuses"] = [{"state": {"terminated": {"finishedAt": "2026-01-01T00:00:07Z"}}}]
    return {"metadata": {"name": f"{job}-s{session}-a{attempt}", "labels": labels,
                         "creationTimestamp": "2026-01-01T00:00:00Z"}, "status": status}


def test_session_bits() -> None:
    bits = SessionBits()
    for s in (0, 7, 8, 9999):
        bits.add(s)
    bits.discard(7)
    bits.discard(123456)  # never added: nothing to do
    assert list(bits) == [0, 8, 9999]


def test_events_give_the_table_a_full_list_would() -> None:
    jobs: dict[str, JobPods] = {}
    stream = [
        (pod(0, 0, None), False), (pod(0, 0, "Pending"), False), (pod(0, 0, "Running"), False), (pod(0, 0, "Succeeded"), False),
        (pod(1, 0, "Running"), False), (pod(1, 0, "Failed"), False), (pod(1, 1, "Running"), False),
        (pod(2, 0, "Running"), False), (pod(2, 0, "Running"), True),  # deleted while running: gone
        (pod(3, 0, "Succeeded"), False), (pod(3, 0, "Succeeded"), True),  # a succeeded pod deleted: session not done
        (pod(0, 0, "Running", job="other"), False),
    ]
    for p, deleted in stream:
        apply_event(jobs, p, deleted)
    jp = jobs["j"]
    assert list(jp.succeeded) == [0]
    assert sorted(jp.live) == ["j-s1-a1"] and sorted(jp.failed) == ["j-s1-a0"]
    table = observe(4, [*jp.live.values(), *jp.failed.values()], [], jp.succeeded)
    assert table.harness_ok == {0} and set(table.alive) == {1} and table.failures == {1: 1}
    assert table.next_attempt[1] == 2
    p = decide(table, has_evaluator=False, parallelism=10, max_retries=2, now=0.0, backoff_base_s=1, backoff_cap_s=1,
             may_start=True)
    assert p.succeeded == [0] and p.running == 1 and [s for s, _ in p.need_pod] == [2, 3]
    # a deleted job's pods going away do not bring its entry back
    jobs.pop("other")
    apply_event(jobs, pod(0, 0, "Running", job="other"), True)
    assert "other" not in jobs
