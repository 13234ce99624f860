"""Names, labels and owner references every child carries, what every pod of a job carries, and a child as the API
server takes it (`as_manifest`: the builders make the kubernetes client's typed objects, the API calls send JSON)."""

from __future__ import annotations

from typing import Any

from kubernetes.client import ApiClient, V1LocalObjectReference, V1ObjectMeta, V1OwnerReference, V1PodSpec

from tracefleet.contract.job import RolloutJob
from tracefleet.operator import names as n

Manifest = dict[str, Any]  # an object as JSON: what the API server takes and the reconcile compares
_SERIALIZER = ApiClient()  # only its sanitize_for_serialization: no connection is made


def as_manifest(obj: object) -> Manifest:
    """A kubernetes client object as JSON (camelCase keys, unset fields left out)."""
    return _SERIALIZER.sanitize_for_serialization(obj)


def namespace_of(job: RolloutJob) -> str:
    return job.metadata.namespace or "default"


def priority_class(job: RolloutJob) -> str | None:
    """Kueue's priority class of the job, given to every pod of it."""
    return (job.metadata.labels or {}).get(n.LABEL_KUEUE_PRIORITY_CLASS)


def pull_secret_names(job: RolloutJob, operator_secrets: tuple[str, ...]) -> list[str]:
    """The Secrets every pod of the job pulls its images with: the operator's (the chart's jobImagePullSecrets), then
    the job's own spec.imagePullSecrets, each once."""
    return list(dict.fromkeys([*operator_secrets, *(ref.name for ref in job.spec.image_pull_secrets or [])]))


def job_pod_spec(job: RolloutJob, operator_secrets: tuple[str, ...], spec: V1PodSpec) -> V1PodSpec:
    """`spec` with what every pod of the job carries, whatever its kind: no service-account token, no service links,
    Kueue's priority class and the pull secrets."""
    spec.automount_service_account_token = False
    spec.enable_service_links = False
    spec.priority_class_name = priority_class(job)
    secrets = pull_secret_names(job, operator_secrets)
    spec.image_pull_secrets = [V1LocalObjectReference(name=name) for name in secrets] or None
    return spec


def owner_reference(job: RolloutJob) -> V1OwnerReference:
    return V1OwnerReference(api_version=n.API_VERSION, kind=n.KIND, name=job.name, uid=job.metadata.uid or "",
                            controller=True, block_owner_deletion=True)


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


def object_meta(job: RolloutJob, name: str, component: str, annotations: dict[str, str] | None = None,
                **labels: str) -> V1ObjectMeta:
    """A child's: its name in the job's namespace, the job's labels, owned by the job."""
    return V1ObjectMeta(name=name, namespace=namespace_of(job), labels=child_labels(job, component, **labels),
                        annotations=annotations, owner_references=[owner_reference(job)])


def metadata(job: RolloutJob, name: str, component: str, **labels: str) -> Manifest:
    """object_meta as JSON, for the children still written as JSON (the NetworkPolicies)."""
    return as_manifest(object_meta(job, name, component, **labels))
