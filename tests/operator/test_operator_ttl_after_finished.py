"""spec.ttlSecondsAfterFinished (operator/ttl_after_finished.py): deleted once completionTime + TTL passed."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import kopf

from fixtures.rolloutjobs import small_job
from tracefleet.operator import names as n
from tracefleet.operator.handlers import configure_settings
from tracefleet.contract.job import RolloutJob, RolloutJobStatus
from tracefleet.operator.ttl_after_finished import ttl_expired

DONE = datetime(2026, 1, 1, tzinfo=timezone.utc)


def job(ttl: int | None) -> RolloutJob:
    return small_job(**({"ttlSecondsAfterFinished": ttl} if ttl is not None else {}))


def test_a_finished_job_goes_once_its_ttl_passed() -> None:
    finished = RolloutJobStatus.model_validate({"phase": "Succeeded", "completionTime": "2026-01-01T00:00:00Z"})
    assert not ttl_expired(job(60), finished, DONE + timedelta(seconds=59))
    assert ttl_expired(job(60), finished, DONE + timedelta(seconds=60))
    assert ttl_expired(job(0), finished, DONE)


def test_no_ttl_or_no_completion_time_keeps_the_job() -> None:
    finished = RolloutJobStatus(completion_time=DONE)
    assert not ttl_expired(job(None), finished, DONE + timedelta(days=365))
    assert not ttl_expired(job(0), RolloutJobStatus(phase="Running"), DONE + timedelta(days=1))


def test_a_job_deleted_mid_pass_is_released_within_a_second_of_the_pass() -> None:
    # the TTL's delete is issued from inside the pass: kopf keeps its finalizer until it sees that timer exit,
    # and by default looks again a minute later (a TTL-deleted job stayed Terminating past 60 s on the real node)
    settings = kopf.OperatorSettings()
    configure_settings(settings)
    assert settings.background.cancellation_polling <= 1.0
    assert settings.persistence.finalizer == n.FINALIZER
