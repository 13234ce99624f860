"""What a reconcile reads of a RolloutJob as kopf hands it over: the job and its status, each validated
with the API model (tracefleet.contract.job) - the one shape a RolloutJob has in the operator."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from tracefleet.contract.job import RolloutJob, RolloutJobStatus

log = logging.getLogger(__name__)

# The metadata the model reads; the API server's own fields (managedFields, resourceVersion, ...) stay out.
METADATA_READ = ("name", "namespace", "labels", "annotations", "generation", "uid")


def plain(value: Any) -> Any:
    """kopf bodies are mapping views; the models want plain JSON values."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def job_of(body: Mapping[str, Any]) -> RolloutJob:
    """The RolloutJob without its status (status is ours to rebuild); raises ValidationError."""
    d = plain(body)
    d.pop("status", None)
    meta = d.get("metadata") or {}
    d["metadata"] = {k: meta[k] for k in METADATA_READ if k in meta}
    return RolloutJob.model_validate(d)


def status_of(body: Mapping[str, Any]) -> RolloutJobStatus:
    """The status the job has; one the model refuses (written by something else) is rebuilt from empty."""
    try:
        return RolloutJobStatus.model_validate(plain(body.get("status") or {}))
    except ValidationError as e:
        name = (body.get("metadata") or {}).get("name")
        log.warning("%s: status not readable, rebuilding it: %s", name, str(e).replace("\n", " ")[:500])
        return RolloutJobStatus()
