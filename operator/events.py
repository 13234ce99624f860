"""The RolloutJob's Events, written by the reconcile itself (synchronously) under deterministic names.

kopf's `kopf.event` queues an Event and posts it after the handler: a leader killed in between loses it.
Here an Event is created before the change it reports is recorded (before the status write that makes a
condition's transition visible, before the sealer Job's annotation that records a batch), and its name is
derived from what it reports - the job, the RolloutJob's resourceVersion the pass read (or the batch's
seq), type, reason and message - so the replica that redoes the pass after a handover gets 409 for the
same Event instead of posting it twice. An Event is therefore posted once, even across a handover.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Any

from tracefleet.operator import names as n

# The Event's source component (what `kubectl describe` shows as "From").
COMPONENT = "tracefleet-operator"
MESSAGE_MAX = 1024


def event_name(job: str, key: str) -> str:
    return f"{job}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def event_manifest(ns: str, job: str, uid: str, type_: str, reason: str, message: str, key: str) -> dict[str, Any]:
    """A core/v1 Event about the RolloutJob `ns/job`, named by `key`."""
    now = datetime.now(timezone.utc)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(job, key), "namespace": ns},
        "involvedObject": {"apiVersion": n.API_VERSION, "kind": n.KIND, "name": job, "namespace": ns, "uid": uid},
        "type": type_,
        "reason": reason,
        "message": message[:MESSAGE_MAX],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "count": 1,
    }


def pass_key(uid: str, resource_version: str, type_: str, reason: str, message: str) -> str:
    """The key of an Event one pass computed from the job as it read it (at `resource_version`)."""
    return f"{uid}/{resource_version}/{type_}/{reason}/{message}"


def batch_key(uid: str, seq: int) -> str:
    return f"{uid}/batch/{seq}"
