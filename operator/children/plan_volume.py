"""A child's plan files (tracefleet.contract.plan_files): the ConfigMaps that hold them and the volume that mounts them.

Each ConfigMap is the job's child like the pod or Job it feeds (owner reference, labels), so it goes with the job,
its TTL included. A child and its ConfigMaps are created together, the ConfigMaps first: a pod whose ConfigMap is
missing waits for it (the kubelet retries the mount) rather than failing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kubernetes.client import (V1ConfigMap, V1ConfigMapProjection, V1KeyToPath, V1ProjectedVolumeSource, V1Volume,
                               V1VolumeMount, V1VolumeProjection)

from tracefleet.contract.plan_files import CONFIG_MAP_BYTES, PLAN_FOLDER
from tracefleet.contract.podenv import PodEnv
from tracefleet.contract.job import RolloutJob
from tracefleet.operator import names as n
from tracefleet.operator.children.metadata import Manifest, as_manifest, object_meta

PLAN_VOLUME = "plan"


def plan_mount(volume: str = PLAN_VOLUME) -> V1VolumeMount:
    """Where a container reads its plan files (PLAN_FOLDER), read-only, from `volume` (plan_volume)."""
    return V1VolumeMount(name=volume, mount_path=PLAN_FOLDER, read_only=True)


@dataclass(frozen=True)
class Child:
    """A pod or Job the operator creates, with the ConfigMaps holding its plan files (created before it)."""

    manifest: Manifest
    config_maps: list[Manifest] = field(default_factory=list)


def plan_config_maps(job: RolloutJob, child: str, component: str, *envs: PodEnv) -> list[Manifest]:
    """The ConfigMaps of the plan files of `envs` (one per container that reads a plan) for the child named `child`:
    as few as hold them, in order."""
    packs: list[dict[str, str]] = [{}]
    used = 0  # bytes in packs[-1]
    for name, text in ((k, v) for env in envs for k, v in env.plan_parts().items()):
        size = len(text.encode())
        if packs[-1] and used + size > CONFIG_MAP_BYTES:
            packs.append({})
            used = 0
        packs[-1][name] = text
        used += size
    return [as_manifest(V1ConfigMap(api_version="v1", kind="ConfigMap",
                                    metadata=object_meta(job, n.plan_config_map_name(child, i), component), data=data))
            for i, data in enumerate(packs)]


def plan_volume(config_maps: list[Manifest], document: str, name: str = PLAN_VOLUME) -> V1Volume:
    """The volume that puts the files of `document` from `config_maps` in one folder (mounted at PLAN_FOLDER:
    plan_mount): a container sees its own plan only."""
    sources = []
    for cm in config_maps:
        keys = [key for key in cm["data"] if key.startswith(document + ".")]
        if keys:
            sources.append(V1VolumeProjection(config_map=V1ConfigMapProjection(
                name=cm["metadata"]["name"], items=[V1KeyToPath(key=key, path=key) for key in keys])))
    return V1Volume(name=name, projected=V1ProjectedVolumeSource(sources=sources))
