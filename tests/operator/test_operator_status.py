"""Phase and conditions from what a reconcile observed (operator/status.py: calculate_status, the one
place they are decided), the Events their transitions give, and the retry intent of API errors."""

from __future__ import annotations

from typing import get_args

import kopf
import pytest
from kubernetes.client.rest import ApiException
from urllib3.exceptions import MaxRetryError

from tracefleet.api.model import Phase
from tracefleet.operator import status as st
from tracefleet.operator.kube import API_RETRY_DELAY_S, FORBIDDEN_RETRY_DELAY_S, retry_intent
from tracefleet.operator.status import Cond, Progress, SessionCounts, calculate_status, condition_events

READY = Cond(st.COND_INFERENCE_READY, True, st.REASON_DEPLOYMENT_AVAILABLE, "1/1 replicas available")


def conds(obs: st.Observed) -> dict[str, tuple[bool | None, str]]:
    return {c.type: (c.status, c.reason) for c in obs.conditions}


def test_phases_are_the_api_models() -> None:
    assert set(st.PHASES) == set(get_args(Phase))


def test_pending_then_running() -> None:
    waiting = calculate_status(Progress(1, SessionCounts(total=4, pending=4),
                                        Cond(st.COND_INFERENCE_READY, False, st.REASON_CREATING, "")))
    assert waiting.phase == st.PENDING and not waiting.started and not waiting.finished
    assert conds(waiting)[st.COND_RUNNING] == (False, st.REASON_WAITING_FOR_INFERENCE)
    starting = calculate_status(Progress(1, SessionCounts(total=4, pending=4), READY))
    assert conds(starting)[st.COND_RUNNING] == (False, st.REASON_STARTING)
    running = calculate_status(Progress(1, SessionCounts(total=4, running=1, pending=3), READY))
    assert running.phase == st.RUNNING and running.started
    assert conds(running) == {st.COND_INFERENCE_READY: (True, st.REASON_DEPLOYMENT_AVAILABLE),
                              st.COND_RUNNING: (True, st.REASON_SESSIONS_RUNNING),
                              st.COND_COMPLETE: (False, st.REASON_IN_PROGRESS),
                              st.COND_FAILED: (False, st.REASON_NOT_FAILED),
                              st.COND_SUSPENDED: (False, st.REASON_NOT_SUSPENDED)}
    assert running.conditions[1].message == "1 running, 0/4 finished"
    # pods deleted by a suspend that are still going away keep the job Running
    assert calculate_status(Progress(1, SessionCounts(total=4, pending=4), READY, terminating=1)).phase == st.RUNNING


def test_finished_only_when_every_batch_is_recorded() -> None:
    counts = SessionCounts(total=4, succeeded=3, failed=1)
    assert calculate_status(Progress(1, counts, READY, unsealed=True)).phase == st.RUNNING
    done = calculate_status(Progress(1, counts, READY, batches=[{"seq": 0}, {"seq": 1}]))
    assert done.phase == st.SUCCEEDED and done.finished
    assert conds(done)[st.COND_COMPLETE] == (True, st.REASON_ALL_SESSIONS_FINISHED)
    assert conds(done)[st.COND_FAILED] == (False, st.REASON_SOME_SESSIONS_SUCCEEDED)
    assert done.conditions[1].message == "3/4 sessions succeeded, 1 failed, 2 batches sealed"
    none_ok = calculate_status(Progress(1, SessionCounts(total=2, failed=2), READY))
    assert none_ok.phase == st.FAILED and conds(none_ok)[st.COND_FAILED] == (True, st.REASON_ALL_SESSIONS_FAILED)
    assert calculate_status(Progress(1, SessionCounts(total=0), READY)).phase == st.SUCCEEDED


def test_a_failed_sealer_fails_the_job_and_suspend_is_its_own_phase() -> None:
    failed = calculate_status(Progress(1, SessionCounts(total=4, succeeded=2, running=2), READY,
                                       seal_failed="sealer Job demo-seal-000000 failed"))
    assert failed.phase == st.FAILED and failed.finished
    assert conds(failed)[st.COND_FAILED] == (True, st.REASON_SEAL_FAILED)
    suspended = calculate_status(Progress(1, SessionCounts(total=4, pending=4), READY, suspended=True))
    assert suspended.phase == st.SUSPENDED and conds(suspended)[st.COND_SUSPENDED] == (True, st.REASON_SPEC_SUSPEND)


def test_a_refused_spec_change_is_a_condition_and_a_warning() -> None:
    obs = calculate_status(Progress(1, SessionCounts(total=4, running=4), READY, spec_rejected="revert it"))
    assert conds(obs)[st.COND_SPEC_ACCEPTED] == (False, st.REASON_IMMUTABLE_FIELD_CHANGED)
    status = st.build_status({}, obs, 5)
    events = condition_events([], status["conditions"])
    assert (st.WARNING, st.REASON_IMMUTABLE_FIELD_CHANGED, "revert it") in events
    assert (st.NORMAL, st.REASON_SESSIONS_RUNNING, "Running: 4 running, 0/4 finished") in events
    assert condition_events(status["conditions"], status["conditions"]) == []  # no transition, no Event


def test_failed_status_keeps_counters_and_writes_once() -> None:
    old = {"phase": st.RUNNING, "counters": {"total": 4, "succeeded": 1}}
    new = st.failed_status(old, 3, st.REASON_CHILD_REJECTED, "create pods: 422", 5)
    assert new is not None and new["phase"] == st.FAILED and new["counters"]["succeeded"] == 1
    assert {c["type"]: c["reason"] for c in new["conditions"]}[st.COND_FAILED] == st.REASON_CHILD_REJECTED
    assert st.failed_status(new, 3, st.REASON_CHILD_REJECTED, "create pods: 422", 5) is None


def _api_error(status: int, headers: dict[str, str] | None = None) -> ApiException:
    e = ApiException(status=status, reason="Reason")
    e.body = '{"kind": "Status", "message": "what the API server said"}'
    e.headers = headers or {}
    return e


@pytest.mark.parametrize(
    ("error", "kind", "delay"),
    [
        (_api_error(422), kopf.PermanentError, None),
        (_api_error(400), kopf.PermanentError, None),
        (_api_error(403), kopf.TemporaryError, FORBIDDEN_RETRY_DELAY_S),
        (_api_error(429, {"Retry-After": "7"}), kopf.TemporaryError, 7.0),
        (_api_error(500), kopf.TemporaryError, API_RETRY_DELAY_S),
        (_api_error(409), kopf.TemporaryError, API_RETRY_DELAY_S),  # a conflicting write: the next pass re-reads
        (MaxRetryError(None, "/api", "connection refused"), kopf.TemporaryError, API_RETRY_DELAY_S),
    ],
)
def test_retry_intent_of_api_errors(error: Exception, kind: type, delay: float | None) -> None:
    intent = retry_intent(error, "create pods team/demo-s0-a0")  # type: ignore[arg-type]
    assert type(intent) is kind
    assert str(intent).startswith("create pods team/demo-s0-a0: ")
    if isinstance(error, ApiException):
        assert "what the API server said" in str(intent)
    if delay is not None:
        assert intent.delay == delay  # type: ignore[union-attr]
