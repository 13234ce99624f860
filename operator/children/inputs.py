"""What pods are given from outside: environment lists and bucket credentials.

The variables themselves are the typed pod environment (tracefleet.contract.podenv, a session's plan among them);
this module turns them into a container's `env`."""

from __future__ import annotations

from typing import Any

from tracefleet.contract.job import RolloutJob

def env_vars(items: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": str(v)} for k, v in items.items()]


def env_ref(name: str) -> str:
    """`$(NAME)`: the kubelet expands it in a container's args from the container's env, so a secret
    value stays out of the args."""
    return f"$({name})"


def bucket_env_from(job: RolloutJob) -> list[dict[str, Any]]:
    if (ref := job.spec.output.credentials_secret_ref) is None:
        return []
    return [{"secretRef": {"name": ref.name}}]
