"""The test control plane is a real Kubernetes: apiserver, controller-manager, scheduler and KWOK work together."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fixtures.controlplane import KubeCluster, pinned_versions
from kubernetes import client


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 60.0, interval_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last value: {last!r}")


@pytest.fixture
def namespace(kube: KubeCluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    r = kube.kubectl("create", "namespace", name)
    assert r.returncode == 0, r.stderr
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false")


def pod_manifest(name: str, gpus: int = 0) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "resources": resources}]},
    }


def test_apiserver_reports_pinned_version(kube: KubeCluster) -> None:
    pinned = pinned_versions()["KUBERNETES_VERSION"]
    assert kube.version == pinned
    r = kube.kubectl("version", "-o", "json")
    assert r.returncode == 0, r.stderr
    versions = json.loads(r.stdout)
    assert versions["serverVersion"]["gitVersion"] == pinned
    assert versions["serverVersion"]["minor"] == pinned.split(".")[1]
    # kubectl is built from the same module, so it reports the same version.
    assert versions["clientVersion"]["gitVersion"] == pinned
    info = client.VersionApi(kube.api_client()).get_code()
    assert info.git_version == pinned


def test_kwok_nodes_are_ready_with_gpus(kube: KubeCluster) -> None:
    nodes = client.CoreV1Api(kube.api_client()).list_node().items
    by_name = {n.metadata.name: n for n in nodes}
    assert set(kube.nodes) <= set(by_name)
    for name in kube.nodes:
        node = by_name[name]
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True"
        assert node.status.allocatable["nvidia.com/gpu"] == "8"


def test_pod_is_scheduled_onto_a_kwok_node_and_runs(kube: KubeCluster, namespace: str) -> None:
    core = client.CoreV1Api(kube.api_client())
    core.create_namespaced_pod(namespace, pod_manifest("gpu-pod", gpus=2))

    def running() -> Any:
        pod = core.read_namespaced_pod("gpu-pod", namespace)
        return pod if pod.status.phase == "Running" else None

    pod = wait_for("the pod to be Running", running)
    assert pod.spec.node_name in kube.nodes
    conditions = {c.type: c.status for c in pod.status.conditions}
    assert conditions.get("PodScheduled") == "True"
    assert conditions.get("Ready") == "True"
    assert pod.status.container_statuses[0].state.running is not None


def test_pod_that_fits_no_node_stays_pending(kube: KubeCluster, namespace: str) -> None:
    # The scheduler really reads node allocatable: 9 GPUs fit on no 8-GPU node.
    core = client.CoreV1Api(kube.api_client())
    core.create_namespaced_pod(namespace, pod_manifest("too-big", gpus=9))

    def unschedulable() -> Any:
        pod = core.read_namespaced_pod("too-big", namespace)
        for c in pod.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return pod
        return None

    pod = wait_for("the scheduler to mark the pod Unschedulable", unschedulable)
    assert pod.status.phase == "Pending"
    assert not pod.spec.node_name
    assert "nvidia.com/gpu" in next(c.message for c in pod.status.conditions if c.type == "PodScheduled")


def test_job_pod_succeeds_through_kwok_stage_and_job_completes(kube: KubeCluster, namespace: str) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "evaluator", "namespace": namespace},
        "spec": {
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox:1.36", "command": ["true"]}],
                }
            },
        },
    }
    r = kube.kubectl("apply", "-f", "-", input=json.dumps(job))
    assert r.returncode == 0, r.stderr
    batch = client.BatchV1Api(kube.api_client())

    def complete() -> Any:
        j = batch.read_namespaced_job("evaluator", namespace)
        done = [c for c in j.status.conditions or [] if c.type == "Complete" and c.status == "True"]
        return j if done else None

    j = wait_for("the Job to be Complete", complete, timeout_s=90)
    assert j.status.succeeded == 2
    assert not j.status.failed
    pods = client.CoreV1Api(kube.api_client()).list_namespaced_pod(
        namespace, label_selector="batch.kubernetes.io/job-name=evaluator"
    ).items
    assert len(pods) == 2
    for pod in pods:
        assert pod.status.phase == "Succeeded"
        assert pod.spec.node_name in kube.nodes
        assert pod.metadata.owner_references[0].kind == "Job"
        assert pod.status.container_statuses[0].state.terminated.exit_code == 0
    r = kube.kubectl("wait", "--for=condition=complete", "job/evaluator", "-n", namespace, "--timeout=10s")
    assert r.returncode == 0, r.stderr


def test_job_pod_fails_after_delay_when_annotated(kube: KubeCluster, namespace: str) -> None:
    # hack/controlplane/kwok-stages.yaml: annotations steer a Job pod's fake outcome and run time.
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "doomed", "namespace": namespace},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {
                    "annotations": {
                        "tracefleet.io/kwok-outcome": "failed",
                        "tracefleet.io/kwok-exit-code": "3",
                        "tracefleet.io/kwok-delay": "3s",
                    }
                },
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox:1.36"}]},
            },
        },
    }
    r = kube.kubectl("apply", "-f", "-", input=json.dumps(job))
    assert r.returncode == 0, r.stderr
    core = client.CoreV1Api(kube.api_client())
    batch = client.BatchV1Api(kube.api_client())

    def pods_in(phase: str) -> Any:
        pods = core.list_namespaced_pod(namespace, label_selector="batch.kubernetes.io/job-name=doomed").items
        return [p for p in pods if p.status.phase == phase]

    running = wait_for("the Job pod to be Running", lambda: pods_in("Running"))
    ran_since = time.monotonic()
    failed = wait_for("the Job pod to fail", lambda: pods_in("Failed"))
    assert time.monotonic() - ran_since > 1.0, "the pod should stay Running for its kwok-delay"
    assert failed[0].metadata.name == running[0].metadata.name
    assert failed[0].status.container_statuses[0].state.terminated.exit_code == 3

    def job_failed() -> Any:
        j = batch.read_namespaced_job("doomed", namespace)
        return j if any(c.type == "Failed" and c.status == "True" for c in j.status.conditions or []) else None

    j = wait_for("the Job to be Failed", job_failed)
    assert j.status.failed == 1
    assert not j.status.succeeded


def test_helm_installs_a_chart_and_its_deployment_becomes_ready(kube: KubeCluster, namespace: str, tmp_path) -> None:
    # helm --wait needs the ReplicaSet controller, the scheduler and KWOK to bring the Deployment's pods up.
    r = kube.helm("create", str(tmp_path / "demo"))
    assert r.returncode == 0, r.stderr
    r = kube.helm("install", "demo", str(tmp_path / "demo"), "-n", namespace, "--set", "replicaCount=2",
                  "--wait", "--timeout", "90s")
    assert r.returncode == 0, r.stderr
    r = kube.helm("list", "-n", namespace, "-o", "json")
    assert r.returncode == 0, r.stderr
    assert [(rel["name"], rel["status"]) for rel in json.loads(r.stdout)] == [("demo", "deployed")]
    dep = client.AppsV1Api(kube.api_client()).read_namespaced_deployment("demo", namespace)
    assert dep.status.ready_replicas == 2


def test_stop_ends_every_component_and_frees_the_port(tmp_path) -> None:
    # A second, private control plane: teardown must leave no process and no listener behind.
    import socket
    from pathlib import Path

    from fixtures.controlplane import controlplane_bin_dir, missing_binaries, start_control_plane

    bin_dir = controlplane_bin_dir()
    assert not missing_binaries(bin_dir), "run `bash hack/setup.sh` to build the control plane"
    cluster = start_control_plane(tmp_path, bin_dir, node_count=1)
    try:
        pids = {c.name: c.process.pid for c in cluster.components if c.process}
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}
        assert all(Path(f"/proc/{pid}").exists() for pid in pids.values())
    finally:
        cluster.stop()
    assert [name for name, pid in pids.items() if Path(f"/proc/{pid}").exists()] == []
    port = int(cluster.server.rsplit(":", 1)[1])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
