"""Phase and conditions from what a reconcile observed (operator/status.py: calculate_status, the one
place they are decided, as a typed RolloutJobStatus), the Events their transitions give, and the retry
intent of API errors."""

from __future__ import annotations

from typing import get_args

import kopf
import pytest
from kubernetes.client.rest import ApiException
from urllib3.exceptions import MaxRetryError

from tracefleet.contract.job import Counters, Phase, RolloutJobStatus
from tracefleet.contract.semantics import DiagnosticsCounts
from tracefleet.contract.sealed_batch import SealedBatch
from tracefleet.operator import status as st
from tracefleet.operator.kube import API_RETRY_DELAY_S, FORBIDDEN_RETRY_DELAY_S, retry_intent
from tracefleet.operator.status import Progress, calculate_status, condition_events, cond

READY = cond(st.COND_INFERENCE_READY, True, st.REASON_DEPLOYMENT_AVAILABLE, "1/1 replicas available")


def batch(seq: int) -> SealedBatch:
    return SealedBatch(seq=seq, uri=f"s3://b/j/batches/{seq:06d}/", traces=2)


def conds(status: RolloutJobStatus) -> dict[str, tuple[bool | None, str | None]]:
    return {c.type: (None if c.status == st.UNKNOWN else c.status == st.TRUE, c.reason) for c in status.conditions or ()}


def started(status: RolloutJobStatus) -> bool:
    return status.start_time is not None


def finished(status: RolloutJobStatus) -> bool:
    return status.completion_time is not None


def test_phases_are_the_api_models() -> None:
    assert set(st.PHASES) == set(get_args(Phase))


def test_pending_then_running() -> None:
    waiting = calculate_status(Progress(1, Counters(total=4, pending=4),
                                        cond(st.COND_INFERENCE_READY, False, st.REASON_CREATING, "")))
    assert waiting.phase == st.PENDING and not started(waiting) and not finished(waiting)
    assert conds(waiting)[st.COND_RUNNING] == (False, st.REASON_WAITING_FOR_INFERENCE)
    starting = calculate_status(Progress(1, Counters(total=4, pending=4), READY))
    assert conds(starting)[st.COND_RUNNING] == (False, st.REASON_STARTING)
    running = calculate_status(Progress(1, Counters(total=4, running=1, pending=3), READY))
    assert running.phase == st.RUNNING and started(running)
    assert conds(running) == {st.COND_INFERENCE_READY: (True, st.REASON_DEPLOYMENT_AVAILABLE),
                              st.COND_RUNNING: (True, st.REASON_SESSIONS_RUNNING),
                              st.COND_COMPLETE: (False, st.REASON_IN_PROGRESS),
                              st.COND_FAILED: (False, st.REASON_NOT_FAILED),
                              st.COND_SUSPENDED: (False, st.REASON_NOT_SUSPENDED)}
    assert running.conditions[1].message == "1 running, 0/4 finished"
    # pods deleted by a suspend that are still going away keep the job Running
    assert calculate_status(Progress(1, Counters(total=4, pending=4), READY, terminating=1)).phase == st.RUNNING


def test_finished_only_when_every_batch_is_recorded() -> None:
    counts = Counters(total=4, succeeded=3, failed=1)
    assert calculate_status(Progress(1, counts, READY, unsealed=True)).phase == st.RUNNING
    done = calculate_status(Progress(1, counts, READY, batches=[batch(0), batch(1)]))
    assert done.phase == st.SUCCEEDED and finished(done) and done.batches_completed == 2
    assert conds(done)[st.COND_COMPLETE] == (True, st.REASON_ALL_SESSIONS_FINISHED)
    assert conds(done)[st.COND_FAILED] == (False, st.REASON_SOME_SESSIONS_SUCCEEDED)
    assert done.conditions[1].message == "3/4 sessions succeeded, 1 failed, 2 batches sealed"
    none_ok = calculate_status(Progress(1, Counters(total=2, failed=2), READY))
    assert none_ok.phase == st.FAILED and conds(none_ok)[st.COND_FAILED] == (True, st.REASON_ALL_SESSIONS_FAILED)
    assert calculate_status(Progress(1, Counters(total=0), READY)).phase == st.SUCCEEDED


def test_a_failed_sealer_fails_the_job_and_suspend_is_its_own_phase() -> None:
    failed = calculate_status(Progress(1, Counters(total=4, succeeded=2, running=2), READY,
                                       seal_failed="sealer Job demo-seal-000000 failed"))
    assert failed.phase == st.FAILED and finished(failed)
    assert conds(failed)[st.COND_FAILED] == (True, st.REASON_SEAL_FAILED)
    suspended = calculate_status(Progress(1, Counters(total=4, pending=4), READY, suspended=True))
    assert suspended.phase == st.SUSPENDED and conds(suspended)[st.COND_SUSPENDED] == (True, st.REASON_SPEC_SUSPEND)


def test_a_refused_spec_change_is_a_condition_and_a_warning() -> None:
    obs = calculate_status(Progress(1, Counters(total=4, running=4), READY, spec_rejected="revert it"))
    assert conds(obs)[st.COND_SPEC_ACCEPTED] == (False, st.REASON_IMMUTABLE_FIELD_CHANGED)
    events = condition_events([], obs.conditions or [])
    assert (st.WARNING, st.REASON_IMMUTABLE_FIELD_CHANGED, "revert it") in events
    assert (st.NORMAL, st.REASON_SESSIONS_RUNNING, "Running: 4 running, 0/4 finished") in events
    assert condition_events(obs.conditions, obs.conditions or []) == []  # no transition, no Event


def test_failed_status_keeps_counters_and_writes_once() -> None:
    old = RolloutJobStatus.model_validate({"phase": st.RUNNING, "counters": {"total": 4, "succeeded": 1}})
    new = st.failed_status(old, 3, st.REASON_CHILD_REJECTED, "create pods: 422", 5)
    assert new is not None and new.phase == st.FAILED and new.counters.succeeded == 1
    patch = st.status_patch(new)  # the wire form: camelCase, no nulls
    assert patch["phase"] == st.FAILED and patch["counters"]["succeeded"] == 1 and "startTime" not in patch
    assert {c["type"]: c["reason"] for c in patch["conditions"]}[st.COND_FAILED] == st.REASON_CHILD_REJECTED
    assert st.failed_status(new, 3, st.REASON_CHILD_REJECTED, "create pods: 422", 5) is None


def test_quarantine_rate_is_a_warning_condition_and_the_job_goes_on() -> None:
    # counters and the condition both come from the sealed batches' counts (tracefleet.contract.semantics)
    assert st.quarantine_condition(DiagnosticsCounts(), 0.25, 4) is None  # nothing judged yet: no condition
    few = st.quarantine_condition(DiagnosticsCounts(judged=2, quarantined=2, quarantined_by={"protected_files": 2}), 0.25, 4)
    assert few is not None and (few.type, few.status, few.reason) == (st.COND_QUARANTINE_RATE, st.FALSE, st.REASON_TOO_FEW_JUDGED)
    hacks = DiagnosticsCounts(judged=6, quarantined=4, dropped=1, quarantined_by={"protected_files": 3, "test_skipping": 2},
                              dropped_by={"test_skipping": 1})
    over = st.quarantine_condition(hacks, 0.25, 4)
    assert over is not None and (over.status, over.reason) == (st.TRUE, st.REASON_QUARANTINE_RATE_ABOVE)
    assert over.message == ("4 of 6 judged sessions quarantined (67%, 1 of them dropped) > maxQuarantineRate 0.25; "
                            "by diagnostic: protected_files 3, test_skipping 2")
    counts = Counters(total=8, running=2, succeeded=6, judged=6, quarantined=4, dropped=1)
    running = calculate_status(Progress(1, counts, READY, quarantine=over))
    assert running.phase == st.RUNNING and conds(running)[st.COND_QUARANTINE_RATE] == (True, st.REASON_QUARANTINE_RATE_ABOVE)
    status = running
    assert {k: st.status_patch(status)["counters"][k] for k in ("judged", "quarantined", "dropped")} == {
        "judged": 6, "quarantined": 4, "dropped": 1}
    events = condition_events([], status.conditions or [])
    assert (st.WARNING, st.REASON_QUARANTINE_RATE_ABOVE, f"{st.COND_QUARANTINE_RATE}: {over.message}") in events
    # the job goes on to Succeeded with the condition kept; no second Event while it holds
    later = calculate_status(Progress(1, Counters(total=8, succeeded=8, judged=8, quarantined=4), READY,
                                      batches=[batch(0)], quarantine=over), status)
    assert later.phase == st.SUCCEEDED and conds(later)[st.COND_QUARANTINE_RATE][0] is True
    assert not [e for e in condition_events(status.conditions, later.conditions or []) if e[0] == st.WARNING]
    # back within the threshold: False, no Event; crossing again warns again
    within = st.quarantine_condition(DiagnosticsCounts(judged=20, quarantined=5), 0.25, 4)
    assert within is not None and (within.status, within.reason) == (st.FALSE, st.REASON_QUARANTINE_RATE_WITHIN)
    assert within.message == "5 of 20 judged sessions quarantined (25%) <= maxQuarantineRate 0.25"
    calm = calculate_status(Progress(1, counts, READY, quarantine=within), later)
    assert not [e for e in condition_events(later.conditions, calm.conditions or []) if e[0] == st.WARNING]
    again = calculate_status(Progress(1, counts, READY, quarantine=over), calm)
    assert [e[1] for e in condition_events(calm.conditions, again.conditions or []) if e[0] == st.WARNING] == [
        st.REASON_QUARANTINE_RATE_ABOVE]


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
