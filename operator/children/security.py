"""Pod and container security contexts: non-root, no privilege escalation, no capabilities."""

from __future__ import annotations

from kubernetes.client import V1Capabilities, V1PodSecurityContext, V1SeccompProfile, V1SecurityContext

NON_ROOT_UID = 65532


def pod_security_context() -> V1PodSecurityContext:
    return V1PodSecurityContext(run_as_non_root=True, run_as_user=NON_ROOT_UID, run_as_group=NON_ROOT_UID,
                                fs_group=NON_ROOT_UID, seccomp_profile=V1SeccompProfile(type="RuntimeDefault"))


def container_security_context(*, read_only_root: bool | None = None, run_as: int | None = None) -> V1SecurityContext:
    """`run_as`: a uid (and gid) of the container's own, where the pod's context sets none (vLLM's pod runs as root)."""
    return V1SecurityContext(allow_privilege_escalation=False, capabilities=V1Capabilities(drop=["ALL"]),
                             run_as_non_root=True, run_as_user=run_as, run_as_group=run_as,
                             read_only_root_filesystem=read_only_root)
