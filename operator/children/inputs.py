"""What pods are given from outside: environment lists and bucket credentials.

The variables themselves are the typed pod environment (tracefleet.contract.podenv, a session's plan among them);
this module turns them into a container's `env`."""

from __future__ import annotations

from kubernetes.client import V1EnvFromSource, V1EnvVar, V1ResourceRequirements, V1SecretEnvSource

from tracefleet.contract.job import ResourceRequirements, RolloutJob


def env_vars(items: dict[str, str]) -> list[V1EnvVar]:
    return [V1EnvVar(name=k, value=str(v)) for k, v in items.items()]


def env_ref(name: str) -> str:
    """`$(NAME)`: the kubelet expands it in a container's args from the container's env, so a secret
    value stays out of the args."""
    return f"$({name})"


def bucket_env_from(job: RolloutJob) -> list[V1EnvFromSource]:
    if (ref := job.spec.output.credentials_secret_ref) is None:
        return []
    return [V1EnvFromSource(secret_ref=V1SecretEnvSource(name=ref.name))]


def job_resources(given: ResourceRequirements | None) -> V1ResourceRequirements | None:
    """A job's resources for a container (None: the job states none); quantities as strings, as the API types them."""
    if given is None:
        return None
    return V1ResourceRequirements(requests=_quantities(given.requests), limits=_quantities(given.limits))


def _quantities(given: dict[str, int | str] | None) -> dict[str, str] | None:
    return None if given is None else {name: str(value) for name, value in given.items()}


def resource_requirements(parts: dict[str, dict[str, int | str]]) -> V1ResourceRequirements:
    """`{"requests": {...}, "limits": {...}}` as the API types it (quantities as strings)."""
    return V1ResourceRequirements(requests=_quantities(parts.get("requests")), limits=_quantities(parts.get("limits")))
