"""What task.toml's [environment] and a phase's network make of a container: `podman run` flags, the same for the
agent's container (tracefleet.runner.containers.place) and the verifier's (tracefleet.runner.containers.verifier)."""

from __future__ import annotations

from typing import Literal

from tracefleet.contract.harbor import TaskConfig


def container_limits(config: TaskConfig, phase: Literal["agent", "verifier"]) -> list[str]:
    """`podman run` flags for task.toml's [environment] cpus and memory_mb (hard limits, no swap beyond the memory,
    as on a cluster where requests = limits) and the phase's network: "public" the runtime's bridge network, else
    none (a loopback only; "allowlist" too: no egress filter by host name here, so it fails closed). storage_mb is
    not a limit here (podman's overlay storage takes no size on this filesystem; Harbor's docker environment does
    not apply it either): a cluster applies it as ephemeral-storage."""
    env = config.environment
    flags = ["--network", "bridge" if config.network(phase) == "public" else "none"]
    if env.cpus is not None:
        flags += ["--cpus", f"{env.cpus:g}"]
    if env.memory_mb is not None:
        flags += ["--memory", f"{env.memory_mb}m", "--memory-swap", f"{env.memory_mb}m"]
    return flags
