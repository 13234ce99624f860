"""Names, labels and owner references every child carries."""

from __future__ import annotations

from typing import Any

from tracefleet.contract.job import RolloutJob
from tracefleet.operator import names as n

Manifest = dict[str, Any]


def namespace_of(job: RolloutJob) -> str:
    return job.metadata.namespace or "default"


def priority_class(job: RolloutJob) -> str | None:
    """Kueue's priority class of the job, given to every pod of it."""
    return (job.metadata.labels or {}).get(n.LABEL_KUEUE_PRIORITY_CLASS)


def pull_secret_names(job: RolloutJob, operator_secrets: tuple[str, ...]) -> list[str]:
    """The Secrets every pod of the job pulls its images with: the operator's (the chart's jobImagePullSecrets), then
    the job's own spec.imagePullSecrets, each once."""
    return list(dict.fromkeys([*operator_secrets, *(ref.name for ref in job.spec.image_pull_secrets or [])]))


def pod_fields(job: RolloutJob, operator_secrets: tuple[str, ...]) -> dict[str, Any]:
    """What every pod spec of the job carries, whatever its kind: Kueue's priority class and the pull secrets."""
    secrets = pull_secret_names(job, operator_secrets)
    return {**({"priorityClassName": pc} if (pc := priority_class(job)) else {}),
            **({"imagePullSecrets": [{"name": name} for name in secrets]} if secrets else {})}


def owner_reference(job: RolloutJob) -> dict[str, Any]:
    return {
        "apiVersion": n.API_VERSION,
        "kind": n.KIND,
        "name": job.name,
        "uid": job.metadata.uid or "",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_labels(job: RolloutJob, component: str, **extra: str) -> dict[str, str]:
    labels = {
        n.LABEL_JOB: job.name,
        n.LABEL_COMPONENT: component,
        n.LABEL_MANAGED_BY: n.MANAGED_BY,
    }
    # Kueue admits and prioritises by these labels on the workload's pods.
    for k, v in (job.metadata.labels or {}).items():
        if k.startswith(n.PROPAGATED_LABEL_PREFIXES):
            labels[k] = v
    labels.update({k: str(v) for k, v in extra.items()})
    return labels


def metadata(job: RolloutJob, name: str, component: str, **labels: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace_of(job),
        "labels": child_labels(job, component, **labels),
        "ownerReferences": [owner_reference(job)],
    }
