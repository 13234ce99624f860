"""What a reconcile reads of the object kopf hands over (operator/body.py): the RolloutJob without its
status or the API server's own metadata, and the status it has, each through the API model."""

from __future__ import annotations

import logging
from types import MappingProxyType

import pytest

from fixtures.rolloutjobs import small_job
from tracefleet.operator.body import job_of, status_of

STATUS = {"phase": "Running", "counters": {"total": 2, "running": 1, "pending": 1}, "batchesCompleted": 0,
          "conditions": [{"type": "Running", "status": "True", "reason": "SessionsRunning", "message": "1 running",
                          "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 3}],
          "startTime": "2026-01-01T00:00:00Z", "observedGeneration": 3}


def body() -> dict:
    manifest = small_job("demo", tasks=2).to_manifest()
    manifest["metadata"].update({"namespace": "team", "uid": "u-1", "generation": 3, "resourceVersion": "77",
                                 "managedFields": [{"manager": "kubectl"}], "creationTimestamp": "2026-01-01T00:00:00Z"})
    return {**manifest, "status": STATUS}


def test_the_job_is_read_without_status_and_apiserver_fields() -> None:
    # kopf hands mapping views, not dicts
    job = job_of(MappingProxyType(body()))
    assert (job.name, job.namespace, job.metadata.uid, job.metadata.generation) == ("demo", "team", "u-1", 3)
    assert job.status is None and (job.metadata.resource_version, job.metadata.managed_fields,
                                   job.metadata.creation_timestamp) == (None, None, None)
    assert [t.id for t in job.spec.tasks.inline or ()] == ["t0", "t1"]


def test_the_status_reads_back_as_written(caplog: pytest.LogCaptureFixture) -> None:
    status = status_of(body())
    assert status.phase == "Running" and status.counters.running == 1 and status.condition("Running") is not None
    assert status.model_dump(mode="json", by_alias=True, exclude_none=True) == {**STATUS, "counters": {
        **{k: 0 for k in ("total", "pending", "running", "succeeded", "failed", "traces", "tokens", "judged", "quarantined",
                          "dropped", "infrastructure")}, **STATUS["counters"]}}
    assert status_of({"metadata": {"name": "new"}}).phase is None  # a new job has none
    with caplog.at_level(logging.WARNING):
        assert status_of({"metadata": {"name": "odd"}, "status": {"phase": "Sleeping"}}).phase is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("odd: status not readable, rebuilding it: ") and "\n" not in line
