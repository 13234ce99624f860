"""Immutable spec fields: a job keeps the spec its sessions started with.

The first reconcile records a hash of the fields below on the job (annotation); a later change to them
is refused by the SpecAccepted=False condition (status.py) instead of being half applied, since finished
sessions and sealed batches would no longer match the spec."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ANNOTATION_SPEC_HASH = "tracefleet.io/immutable-spec"
IMMUTABLE_SPEC_FIELDS = ("inference", "harness", "tasks", "evaluator", "output")
REFUSED_MESSAGE = (f"changes to spec.{{{','.join(IMMUTABLE_SPEC_FIELDS)}}} are not applied; revert them or create a new "
                   "RolloutJob")


def immutable_hash(spec: Mapping[str, Any]) -> str:
    """Of the spec as the API server holds it (camelCase JSON), so the hash recorded on a job by any
    operator version compares equal while those fields stay as they were."""
    part = {k: spec.get(k) for k in IMMUTABLE_SPEC_FIELDS}
    return hashlib.sha256(json.dumps(part, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SpecCheck:
    record: dict[str, str]  # annotations to write: the hash, on first sight
    refused: str  # why the spec's change is not applied; "" when it is accepted


def check_spec(spec: Mapping[str, Any], annotations: Mapping[str, str] | None) -> SpecCheck:
    current = immutable_hash(spec)
    recorded = (annotations or {}).get(ANNOTATION_SPEC_HASH)
    if recorded is None:
        return SpecCheck({ANNOTATION_SPEC_HASH: current}, "")
    return SpecCheck({}, REFUSED_MESSAGE if recorded != current else "")
