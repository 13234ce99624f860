"""Names, labels and owner references every child carries."""

from __future__ import annotations

from typing import Any

from .. import names as n
from ..view import JobView

Manifest = dict[str, Any]


def owner_reference(job: JobView) -> dict[str, Any]:
    return {
        "apiVersion": n.API_VERSION,
        "kind": n.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_labels(job: JobView, component: str, **extra: str) -> dict[str, str]:
    labels = {
        n.LABEL_JOB: job.name,
        n.LABEL_COMPONENT: component,
        n.LABEL_MANAGED_BY: n.MANAGED_BY,
    }
    # Kueue admits and prioritises by these labels on the workload's pods.
    for k, v in job.labels.items():
        if k.startswith(n.PROPAGATED_LABEL_PREFIXES):
            labels[k] = v
    labels.update({k: str(v) for k, v in extra.items()})
    return labels


def metadata(job: JobView, name: str, component: str, **labels: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": child_labels(job, component, **labels),
        "ownerReferences": [owner_reference(job)],
    }
