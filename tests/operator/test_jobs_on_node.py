"""RolloutJobs on a real node (tests/fixtures/node.py): a kubelet, containerd and runc run every pod, the operator's
and the bucket's included, from the images `tracefleet images build` makes, named as the chart names them for users.

`helm install` of the chart from the repository, its defaults but one replica: the operator runs as the chart's
Deployment, in a pod on the node, with the chart's ServiceAccount and RBAC, and reaches the API server through the
`kubernetes` Service (kube-proxy). The bucket is in the cluster: SeaweedFS as a pod and a Service on its usual S3 port
(8333, plain HTTP); the sidecars and sealers write it by the Service's name (cluster DNS), and the test reads the
batches through BatchReader from outside the cluster (the Service's address), as a trainer does. The engine (the scripted `tracefleet engine`) runs
on this machine's address, as an external engine does.

Two jobs, applied with kubectl: examples/k8s/first-job.yaml with the one line a user edits (the engine's URL), a
`command` harness in the tracefleet image; and Qwen Code from its harness image, whose own shell tool writes the file
a command evaluator judges. For each, the test watches every child pod (harness pods with the proxy as a native
sidecar, evaluator and sealer Jobs) and asks the kubelet's own reports: Succeeded (the harness pods Running first),
every container started and terminated with exit code 0, each pod with its own address; then reads the sealed batches through BatchReader.

Measured (2 cores): on a quiet machine the node Ready in 5.7 s, the chart's operator pod available 4.4 s after
`helm install`, `kubectl apply` to the first sealed batch 18 s and to Succeeded 21-25 s; shared with other sessions'
suites, the node in up to 19 s and the first sealed batch in 24-46 s (97 s once); the two images
rebuilt from the layer cache in 5-12 s, loaded into containerd in 19-25 s each when they changed (never when the
image id is the same). With the NetworkPolicy enforcer and CoreDNS as a pod: the node Ready in 7.2 s, `kubectl apply`
to the first sealed batch 13-18 s and to Succeeded 20 s.

The NetworkPolicies the operator writes are enforced (the node's kube-router): every child pod's traffic runs through
its job's policy for its component while it runs (read from kube-router's rules), and the jobs still succeed: the
sidecar reaches the engine on this machine and SeaweedFS by its Service's name on 8333, the sealer SeaweedFS, both
through the kube-dns pod. test_network_on_node.py shows what the same policies block.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, watch

from fixtures.engines import EngineProcess
from fixtures.harness_runs import EXPECTED_NOTE, PROMPT, harness_script
from fixtures.node import CLUSTER_DOMAIN
from fixtures.s3 import S3Endpoint, identities, weed_binary
from tracefleet.bucket import open_bucket
from tracefleet.contract import images
from tracefleet.operator import names as n
from tracefleet.runner.containers.runtime import BASE_IMAGE
from tracefleet.traces.reader import BatchReader

REPO = Path(__file__).resolve().parents[2]
S3_PORT = 8333  # SeaweedFS's S3 port
SEAWEEDFS_IMAGE = "localhost/tracefleet-test/seaweedfs:latest"
NAMESPACE = "tracefleet"
RELEASE = "tf"
CLI = "qwen-code"  # the smallest CLI (55 MB)
REFS = [images.image_ref(images.DEFAULT_REGISTRY, name, images.release_tag())
        for name in (images.TRACEFLEET, images.harness_image_name(CLI))]  # as the chart names them


def tracefleet(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracefleet.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def node_images(node, container_runtime) -> list[str]:
    """The images the chart names by default, built (cached by layer) and loaded into the node (once per id)."""
    start = time.monotonic()
    r = tracefleet("images", "build", "--only", images.TRACEFLEET, "--only", images.harness_image_name(CLI),
                   timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    built = time.monotonic()
    loaded = [ref for ref in REFS if node.load_image(container_runtime, ref)]
    print(f"images built in {built - start:.0f} s, {loaded or 'none'} loaded into the node "
          f"in {time.monotonic() - built:.0f} s")
    return REFS


@pytest.fixture(scope="module")
def host_engine(node) -> Iterator[EngineProcess]:
    engine = EngineProcess(["--backend", "scripted", "--model", "smollm2"], host=node.host)
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def cluster_s3(node, container_runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    """The in-cluster bucket: SeaweedFS (the `weed` the tests run everywhere, in the base image) as a pod and a
    Service on its usual S3 port, plain HTTP, in the chart's namespace. The pods write it through the Service; the
    trainer (this test) reads it from outside the cluster, through the same address."""
    context = tmp_path_factory.mktemp("seaweedfs-image")
    try:
        os.link(weed_binary(), context / "weed")  # 150 MB: a link where the folders share a file system
    except OSError:
        shutil.copy2(weed_binary(), context / "weed")
    (context / "Containerfile").write_text(f"FROM {BASE_IMAGE}\nCOPY weed /usr/local/bin/weed\n")
    container_runtime.run("build", "-q", "-t", SEAWEEDFS_IMAGE, "-f", str(context / "Containerfile"), str(context),
                          timeout=600)  # cached by the layer's content: the same image id, never reloaded
    node.load_image(container_runtime, SEAWEEDFS_IMAGE)
    kube = node.kube
    endpoint = S3Endpoint("", "tf" + secrets.token_hex(8), secrets.token_hex(20))
    assert kube.kubectl("create", "namespace", NAMESPACE).returncode == 0
    assert kube.kubectl("-n", NAMESPACE, "create", "secret", "generic", "seaweedfs-identities",
                        "--from-literal=s3.json=" + identities(endpoint.access_key, endpoint.secret_key)
                        ).returncode == 0
    args = ["-dir=/data", "-ip.bind=0.0.0.0", "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
            "-s3.config=/config/s3.json", "-volume.max=100", "-master.volumeSizeLimitMB=64"]
    objects = [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "seaweedfs", "labels": {"app": "seaweedfs"}},
         "spec": {"containers": [{"name": "weed", "image": SEAWEEDFS_IMAGE, "imagePullPolicy": "Never",
                                  "command": ["weed", "mini", *args], "ports": [{"containerPort": S3_PORT}],
                                  "readinessProbe": {"tcpSocket": {"port": S3_PORT}, "periodSeconds": 1},
                                  "volumeMounts": [{"name": "data", "mountPath": "/data"},
                                                   {"name": "config", "mountPath": "/config"}]}],
                  "volumes": [{"name": "data", "emptyDir": {}},
                              {"name": "config", "secret": {"secretName": "seaweedfs-identities"}}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "seaweedfs"},
         "spec": {"selector": {"app": "seaweedfs"}, "ports": [{"port": S3_PORT, "targetPort": S3_PORT}]}},
    ]
    for obj in objects:
        assert kube.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=json.dumps(obj)).returncode == 0
    r = kube.kubectl("-n", NAMESPACE, "wait", "--for=condition=Ready", "pod/seaweedfs", "--timeout=120s", timeout=150)
    assert r.returncode == 0, r.stderr + kube.kubectl("-n", NAMESPACE, "logs", "seaweedfs").stdout[-3000:]
    cluster_ip = kube.kubectl("-n", NAMESPACE, "get", "service", "seaweedfs", "-o", "jsonpath={.spec.clusterIP}").stdout
    endpoint.endpoint = f"http://{cluster_ip}:{S3_PORT}"
    deadline = time.monotonic() + 60
    while True:  # the S3 gateway answers once its filer and volume server are up
        try:
            endpoint.create_bucket("tracefleet")
            break
        except Exception:  # noqa: BLE001 - not yet; the last failure is raised at the deadline
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    yield endpoint
    kube.kubectl("-n", NAMESPACE, "delete", "pod,service", "seaweedfs", "--wait=false")


class PodWatch:
    """Every phase and container state the kubelet reports for the namespace's pods, from a watch."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.phases: dict[str, list[str]] = {}
        self.last: dict[str, Any] = {}
        self._stop = threading.Event()
        self._core = client.CoreV1Api(api)
        self._namespace = namespace
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            w = watch.Watch()
            for event in w.stream(self._core.list_namespaced_pod, self._namespace, timeout_seconds=5):
                pod = event["object"]
                seen = self.phases.setdefault(pod.metadata.name, [])
                if not seen or seen[-1] != pod.status.phase:
                    seen.append(pod.status.phase)
                self.last[pod.metadata.name] = pod
                if self._stop.is_set():
                    w.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


class Fenced:
    """The NetworkPolicies kube-router runs a job's pods' traffic through, read from its rules while they run."""

    def __init__(self, node: Any, pods: PodWatch, job: str) -> None:
        self.policies: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(node, pods, job), daemon=True)
        self._thread.start()

    def _run(self, node: Any, pods: PodWatch, job: str) -> None:
        while not self._stop.wait(0.2):
            for name, pod in list(pods.last.items()):
                if pod.metadata.labels.get(n.LABEL_JOB) == job:
                    self.policies |= node.enforced_policies(NAMESPACE, name) or set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


@dataclass
class Installed:
    """The chart installed with its operator Deployment running on the node, the bucket and its Secret in the chart's
    namespace."""

    kube: Any
    custom: client.CustomObjectsApi
    pods: PodWatch
    bucket: str
    seconds: float

    def operator_log(self) -> str:
        return self.kube.kubectl("-n", NAMESPACE, "logs", f"deploy/{RELEASE}-tracefleet", "--tail=60").stdout


@pytest.fixture(scope="module")
def installed(node, node_images, cluster_s3: S3Endpoint) -> Iterator[Installed]:
    kube = node.kube
    api = kube.api_client()
    pods = PodWatch(api, NAMESPACE)
    t0 = time.monotonic()
    # the pods name the bucket by its Service's name, as a user's Secret does (cluster DNS)
    creds = {**cluster_s3.env(), "AWS_ENDPOINT_URL": f"http://seaweedfs.{NAMESPACE}.svc.{CLUSTER_DOMAIN}:{S3_PORT}"}
    assert kube.kubectl("-n", NAMESPACE, "create", "secret", "generic", "bucket-credentials",
                        *(f"--from-literal={k}={v}" for k, v in creds.items())).returncode == 0
    # the chart's defaults but one replica: the operator reaches the API server through the `kubernetes` Service
    r = kube.helm("install", RELEASE, str(REPO / "charts" / "tracefleet"), "--namespace", NAMESPACE,
                  "--set", f"image.registry={images.DEFAULT_REGISTRY}", "--set", "operator.replicas=1",
                  "--wait", "--timeout", "180s")
    assert r.returncode == 0, r.stdout + r.stderr + kube.kubectl("-n", NAMESPACE, "describe", "pods").stdout[-3000:]
    (operator,) = [p for p in pods.last.values() if p.metadata.name.startswith(f"{RELEASE}-tracefleet-")]
    assert operator.spec.node_name == node.name and operator.spec.containers[0].image == REFS[0]
    try:
        yield Installed(kube, client.CustomObjectsApi(api), pods, "tracefleet", time.monotonic() - t0)
    finally:
        pods.stop()
        kube.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")


def run_job(node, cluster: Installed, s3: S3Endpoint, manifest: dict[str, Any]) -> tuple[dict[str, Any], BatchReader]:
    """Apply the job, wait for its final phase, and check every child pod as the kubelet reported it: Running, then
    Succeeded, every container terminated with exit code 0, on the node with an address of its own."""
    job = manifest["metadata"]["name"]
    kube = node.kube
    applied = time.monotonic()
    r = kube.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump(manifest))
    assert r.returncode == 0, r.stderr
    reader = BatchReader(open_bucket(manifest["spec"]["output"]["uri"], **s3.bucket_options()), job)
    first_batch = None
    status: dict[str, Any] = {}
    fenced = Fenced(node, cluster.pods, job)
    deadline = applied + 420
    try:
        while time.monotonic() < deadline and status.get("phase") not in ("Succeeded", "Failed"):
            time.sleep(1)
            if first_batch is None and reader.seqs():
                first_batch = time.monotonic() - applied
            rj = cluster.custom.get_namespaced_custom_object(n.GROUP, n.VERSION, NAMESPACE, n.PLURAL, job)
            status = rj.get("status") or {}
        print(f"{job}: node started in {node.start_seconds:.1f} s; chart + operator in {cluster.seconds:.1f} s; "
              f"apply -> first sealed batch {first_batch} s; apply -> {status.get('phase')} "
              f"{time.monotonic() - applied:.1f} s")
        time.sleep(2)  # the watch's last events
        if status.get("phase") != "Succeeded":  # printed whole: pytest shortens a long assertion message
            print(json.dumps(status, indent=1), cluster.operator_log(), _pod_report(kube, cluster.pods), sep="\n")
        assert status.get("phase") == "Succeeded", status.get("conditions")
        # every child ran fenced by the policies the operator wrote for it (the job's evaluators and sealers, its
        # harness pods), and still reached the engine, the bucket and DNS
        fenced.stop()
        assert fenced.policies == {n.network_policy_name(job), n.evaluator_network_policy_name(job),
                                   n.sealer_network_policy_name(job)}, fenced.policies
        pods = cluster.pods
        children = {name: pod for name, pod in pods.last.items() if pod.metadata.labels.get(n.LABEL_JOB) == job}
        components = sorted({pod.metadata.labels[n.LABEL_COMPONENT] for pod in children.values()})
        assert components == sorted([n.COMPONENT_HARNESS, n.COMPONENT_EVALUATOR, n.COMPONENT_SEALER]), components
        for name, pod in children.items():
            assert pods.phases[name][-1] == "Succeeded", (name, pods.phases[name])
            assert pod.spec.node_name == node.name and pod.status.pod_ip and pod.status.pod_ip != node.host
            statuses = (pod.status.init_container_statuses or []) + (pod.status.container_statuses or [])
            assert statuses and all(s.state.terminated and s.state.terminated.exit_code == 0
                                    and s.state.terminated.started_at for s in statuses), (name, statuses)
        harness = [p for p in children.values() if p.metadata.labels[n.LABEL_COMPONENT] == n.COMPONENT_HARNESS]
        # A pod that ran for a second can go from Pending to Succeeded in one status update (the kubelet reports
        # at most one a sync); a harness pod runs long enough to be seen Running.
        assert all(pods.phases[p.metadata.name][-2:] == ["Running", "Succeeded"] for p in harness), pods.phases
        assert len({p.status.pod_ip for p in harness}) == len(harness) == status["counters"]["total"]
        return status, reader
    finally:
        fenced.stop()
        cluster.custom.delete_namespaced_custom_object(n.GROUP, n.VERSION, NAMESPACE, n.PLURAL, job)


def test_first_job_runs_on_the_real_node(node, installed: Installed, host_engine, cluster_s3) -> None:
    manifest = yaml.safe_load((REPO / "examples" / "k8s" / "first-job.yaml").read_text())
    manifest["spec"]["inference"]["external"]["baseUrl"] = host_engine.url  # the one line a user edits
    manifest["spec"]["output"]["uri"] = f"s3://{installed.bucket}/rollouts"
    status, reader = run_job(node, installed, cluster_s3, manifest)
    # the batches a trainer reads
    seqs = reader.seqs()
    assert len(seqs) == 2 and status["batchesCompleted"] == 2
    traces = [t for seq in seqs for t in reader.read(seq).traces()]
    assert len(traces) == 4 and all(int(t.loss_mask.sum()) > 0 for t in traces)


def test_a_real_cli_preset_runs_on_the_real_node(node, installed: Installed, host_engine, cluster_s3) -> None:
    """Qwen Code from its harness image (the chart's default for the preset): two shell rounds through its own
    tool, judged by a command evaluator on the file they wrote."""
    host_engine.configure(**harness_script(CLI))
    try:
        manifest = {
            "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "cli-job"},
            "spec": {
                "inference": {"external": {"baseUrl": host_engine.url}, "capture": {"mode": "server"}},
                "harness": {"preset": CLI, "sessionTimeoutSeconds": 240},
                "tasks": {"inline": [{"id": "note", "prompt": PROMPT}], "samplesPerTask": 2},
                "evaluator": {"preset": "command", "timeoutSeconds": 60,
                              "command": ["sh", "-c", f"printf '{EXPECTED_NOTE}' | cmp -s - note.txt"]},
                "output": {"uri": f"s3://{installed.bucket}/cli", "tracesPerBatch": 2,
                           "credentialsSecretRef": {"name": "bucket-credentials"}},
                "parallelism": 2,
            },
        }
        status, reader = run_job(node, installed, cluster_s3, manifest)
    finally:
        host_engine.reset()
    (seq,) = reader.seqs()
    traces = reader.read(seq).traces()
    assert len(traces) >= 2 and all(t.meta.harness == CLI for t in traces)
    assert {t.meta.reward for t in traces} == {1.0}  # the CLI's shell tool wrote note.txt in the harness container
    assert sum(int(t.loss_mask.sum()) for t in traces) > 0
    assert status["counters"]["succeeded"] == 2


def _pod_report(kube, pods: PodWatch) -> str:
    """Each pod's phases and container states, and the logs of those that did not succeed."""
    lines = []
    for name, pod in pods.last.items():
        statuses = (pod.status.init_container_statuses or []) + (pod.status.container_statuses or [])
        lines.append(f"{name}: {pods.phases.get(name)} {[(s.name, s.state.to_dict()) for s in statuses]}")
        for s in statuses:
            if s.state.terminated and s.state.terminated.exit_code != 0:
                logs = kube.kubectl("-n", NAMESPACE, "logs", name, "-c", s.name).stdout
                lines.append(f"----- {name}/{s.name} log\n{logs[-3000:]}")
    return "\n".join(lines)
