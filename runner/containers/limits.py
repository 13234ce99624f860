"""What task.toml's [environment] and a phase's network make of a container: `podman run` flags, the same for the
agent's container (tracefleet.runner.containers.place) and the verifier's (tracefleet.runner.containers.verifier)."""

from __future__ import annotations

from typing import Literal

from tracefleet.contract.harbor import PUBLIC_NETWORK, TaskConfig


def container_limits(config: TaskConfig, phase: Literal["agent", "verifier"]) -> list[str]:
    """`podman run` flags for task.toml's [environment] cpus and memory_mb (hard limits, no swap beyond the memory,
    as on a cluster where requests = limits) and the phase's network: "public" the runtime's bridge network, else
    none (a loopback only; "allowlist" too: no egress filter by host name here, so it fails closed). What it cannot
    hold: `not_enforced`."""
    env = config.environment
    flags = ["--network", "bridge" if config.network(phase) == PUBLIC_NETWORK else "none"]
    if env.cpus is not None:
        flags += ["--cpus", f"{env.cpus:g}"]
    if env.memory_mb is not None:
        flags += ["--memory", f"{env.memory_mb}m", "--memory-swap", f"{env.memory_mb}m"]
    return flags


def not_enforced(config: TaskConfig) -> str | None:
    """What of task.toml's [environment] a local container does not hold, in one line (said when the task's image is
    ready; the task runs), or None. storage_mb: podman's overlay storage takes a size only on an XFS store mounted
    with project quotas (`--storage-opt size`; on ext4 podman refuses the option), and Harbor's docker environment
    does not apply it either; a cluster applies it as ephemeral-storage. gpus: no GPU is passed into a container."""
    env = config.environment
    said = ([f"storage_mb {env.storage_mb} is not a limit here (podman's overlay storage takes a size only on XFS "
             "with project quotas)"] if env.storage_mb is not None else [])
    said += [f"gpus {env.gpus}: no GPU is passed into a local container"] if env.gpus else []
    return "; ".join(said) or None
