"""The NetworkPolicies the operator writes, enforced on the real node (tests/fixtures/node.py: kube-router's
network-policy controller, iptables and ipsets) and tried from inside pods carrying the labels the operator gives a
job's harness and sealer pods.

The policies are the operator's own (operator/children/network_policy.py: `job_reach` from the job and its credentials
Secret, `network_policies`), applied as the operator applies them. The bucket is in the cluster on a non-443 port
(8333, plain HTTP, named by its Service in the Secret's AWS_ENDPOINT_URL), the engine on this machine's address (an
external engine), cluster DNS the kube-dns pod. Each probe is a TCP connection made with `kubectl exec` in a running
pod, once kube-router's rules run that pod's traffic through the job's policies; a pod no policy selects, in the same
namespace, tries the same addresses, so a blocked address is blocked by the policy and not unreachable anyway.

test_jobs_on_node.py runs whole jobs (the operator from the chart, SeaweedFS, the sidecar and the sealer) with the
same enforcement.
"""

from __future__ import annotations

import http.server
import ipaddress
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fixtures.node import CLUSTER_DOMAIN, echo_server, pod_status
from tracefleet.contract.job import RolloutJob
from tracefleet.operator import names as n
from tracefleet.operator.children.network_policy import job_reach, network_policies
from tracefleet.operator.config import OperatorConfig
from tracefleet.runner.containers.runtime import BASE_IMAGE

NAMESPACE = "netpol"
JOB = "fenced"
BUCKET_PORT = 8333  # SeaweedFS's S3 port: plain HTTP, not 443
PROBE_PORT = 8080  # every probe pod serves echo_server here


def outside_address() -> str:
    """An address outside this machine that it reaches: its resolver (TCP 53)."""
    for line in Path("/etc/resolv.conf").read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["nameserver"] and ipaddress.ip_address(parts[1]).version == 4 \
                and not ipaddress.ip_address(parts[1]).is_loopback:
            return parts[1]
    raise AssertionError("no IPv4 nameserver outside this machine in /etc/resolv.conf to try as an outside address")


class Answering:
    """A TCP server on this machine's address that answers every connection (the engine, or any other port)."""

    def __init__(self, host: str) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(204)
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


def probe_pod(name: str, labels: dict[str, str], port: int = PROBE_PORT) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [
                {"name": "c", "image": BASE_IMAGE, "imagePullPolicy": "Never",
                 "command": ["sh", "-c", echo_server(port)],
                 "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                 "ports": [{"containerPort": port}],
                 "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1}}]}}


def fenced_job(name: str, engine_url: str) -> RolloutJob:
    return RolloutJob.model_validate({
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": "00000000-0000-0000-0000-00000000f00d"},
        "spec": {"inference": {"external": {"baseUrl": engine_url}},
                 "harness": {"preset": "command", "command": ["true"]},
                 "tasks": {"inline": [{"id": "t", "prompt": "p"}]},
                 "output": {"uri": "s3://tracefleet/fenced", "credentialsSecretRef": {"name": "bucket-credentials"}}},
    })


class Cluster:
    def __init__(self, node: Any) -> None:
        self.node = node
        self.kube = node.kube

    def apply(self, obj: dict[str, Any]) -> None:
        r = self.kube.kubectl("apply", "-f", "-", input=json.dumps(obj))
        assert r.returncode == 0, r.stderr

    def service(self, namespace: str, name: str) -> dict[str, Any] | None:
        r = self.kube.kubectl("-n", namespace, "get", "service", name, "-o", "json")
        return json.loads(r.stdout) if r.returncode == 0 else None

    def ready(self, *names: str) -> None:
        r = self.kube.kubectl("-n", NAMESPACE, "wait", "--for=condition=Ready", *(f"pod/{p}" for p in names),
                              "--timeout=90s", timeout=120)
        assert r.returncode == 0, r.stderr

    def ip(self, pod: str) -> str:
        return pod_status(self.node, NAMESPACE, pod)["podIP"]

    def fenced_by(self, pod: str, policies: set[str], timeout: float = 30) -> float:
        """Seconds until kube-router's rules run `pod` through exactly `policies`."""
        start = time.monotonic()
        while (seen := self.node.enforced_policies(NAMESPACE, pod)) != policies:
            assert time.monotonic() - start < timeout, (pod, seen, policies)
            time.sleep(0.1)
        return time.monotonic() - start

    def reaches(self, pod: str, host: str, port: int) -> bool:
        """Whether a TCP connection from `pod` to host:port opens within 3 s."""
        r = self.kube.kubectl("-n", NAMESPACE, "exec", pod, "--", "bash", "-c",
                              f"timeout 3 bash -c 'exec 3<>/dev/tcp/{host}/{port}' && echo open || echo closed",
                              timeout=30)
        assert r.stdout.strip() in ("open", "closed"), (pod, host, port, r.stdout, r.stderr)
        return r.stdout.strip() == "open"

    def resolves(self, pod: str, name: str) -> str:
        r = self.kube.kubectl("-n", NAMESPACE, "exec", pod, "--", "getent", "hosts", name, timeout=30)
        return r.stdout.split()[0] if r.returncode == 0 and r.stdout else ""

    def bucket_answers(self, pod: str, host: str) -> str:
        """What the bucket's server answers to a GET from `pod` (the address of the pod behind the Service)."""
        script = (f"exec 3<>/dev/tcp/{host}/{BUCKET_PORT} && printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3 && tail -1 <&3")
        for _ in range(3):  # a reset is retried: it says the path is open, and it is not what is asserted here
            r = self.kube.kubectl("-n", NAMESPACE, "exec", pod, "--", "timeout", "5", "bash", "-c", script, timeout=30)
            answer = r.stdout.strip() or r.stderr.strip()
            if "reset by peer" not in answer:
                break
        return answer


@pytest.fixture(scope="module")
def cluster(node, container_runtime) -> Iterator[Cluster]:
    node.load_image(container_runtime, BASE_IMAGE)
    c = Cluster(node)
    assert c.kube.kubectl("create", "namespace", NAMESPACE).returncode == 0
    try:
        yield c
    finally:
        c.kube.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def test_a_harness_pod_reaches_only_dns_the_engine_and_the_bucket(cluster: Cluster, node) -> None:
    engine, elsewhere = Answering(node.host), Answering(node.host)
    outside = outside_address()
    api_port = int(cluster.kube.server.rsplit(":", 1)[1])
    bucket_host = f"bucket.{NAMESPACE}.svc.{CLUSTER_DOMAIN}"
    job_labels = {n.LABEL_JOB: JOB}
    try:
        cluster.apply(probe_pod("bucket", {"app": "bucket"}, BUCKET_PORT))
        cluster.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bucket", "namespace": NAMESPACE},
                       "spec": {"selector": {"app": "bucket"}, "ports": [{"port": BUCKET_PORT}]}})
        # what the operator writes for the job, from the job and its credentials Secret, as it writes it (less the
        # owner reference: no RolloutJob owns them here, and the garbage collector would delete them)
        job = fenced_job(JOB, f"http://{node.host}:{engine.port}")
        secret_env = {"AWS_ENDPOINT_URL": f"http://{bucket_host}:{BUCKET_PORT}"}
        reach = job_reach(job, OperatorConfig(), secret_env, cluster.service)
        policies = network_policies(job, reach, None)
        for policy in policies:
            policy["metadata"].pop("ownerReferences")
            cluster.apply(policy)
        cluster.apply(probe_pod("harness", {**job_labels, n.LABEL_COMPONENT: n.COMPONENT_HARNESS}))
        cluster.apply(probe_pod("sealer", {**job_labels, n.LABEL_COMPONENT: n.COMPONENT_SEALER}))
        cluster.apply(probe_pod("other", {"app": "other"}))  # no policy selects it
        cluster.ready("bucket", "harness", "sealer", "other")
        cluster.fenced_by("harness", {n.network_policy_name(JOB)})
        cluster.fenced_by("sealer", {n.sealer_network_policy_name(JOB)})
        cluster.fenced_by("other", set())
        bucket_vip = cluster.service(NAMESPACE, "bucket")["spec"]["clusterIP"]
        ips = {p: cluster.ip(p) for p in ("bucket", "harness", "sealer", "other")}

        # the pod no policy selects reaches all of it: what the policies block below is there to reach; and the
        # bucket through its Service once kube-proxy has its endpoint (a moment after the pod is Ready)
        deadline = time.monotonic() + 30
        while cluster.bucket_answers("other", bucket_host) != ips["bucket"]:
            assert time.monotonic() < deadline, "the bucket's Service did not answer a pod no policy selects in 30 s"
            time.sleep(0.5)
        not_pods = {"API Service": ("10.96.0.1", 443), "API server": (node.host, api_port),
                      "this machine": (node.host, elsewhere.port), "outside": (outside, 53)}
        assert {k: cluster.reaches("other", h, p) for k, (h, p) in not_pods.items()} == dict.fromkeys(not_pods, True)
        # and no pod reaches a harness or a sealer pod (their policies' empty ingress), though both serve
        assert not cluster.reaches("other", ips["harness"], PROBE_PORT)
        assert not cluster.reaches("other", ips["sealer"], PROBE_PORT)

        for pod in ("harness", "sealer"):
            # DNS from the kube-dns pod, and the bucket through its Service's name on its own port
            assert cluster.resolves(pod, bucket_host) == bucket_vip, pod
            assert cluster.bucket_answers(pod, bucket_host) == ips["bucket"], pod
            blocked = {"other pod": (ips["other"], PROBE_PORT), **not_pods}
            reached = {k: cluster.reaches(pod, h, p) for k, (h, p) in blocked.items()}
            assert reached == dict.fromkeys(blocked, False), pod
        assert cluster.reaches("harness", node.host, engine.port)  # the engine: the harness's sidecar's
        assert not cluster.reaches("sealer", node.host, engine.port)  # a sealer has no business with it
    finally:
        engine.stop()
        elsewhere.stop()
        cluster.kube.kubectl("-n", NAMESPACE, "delete", "pod,service,networkpolicy", "--all", "--wait=false")


def test_how_soon_a_policy_holds(cluster: Cluster, node) -> None:
    """From `kubectl apply` of a job's harness policy to a running harness pod's next connection being refused; and a
    new harness pod under that policy: how long after its container starts its connections are still let through
    (kube-router writes a pod's rules once the API server reports its address, so a pod's first moments are not
    filtered: the docs say so)."""
    late = "late"
    labels = {n.LABEL_JOB: late, n.LABEL_COMPONENT: n.COMPONENT_HARNESS}
    try:
        cluster.apply(probe_pod("target", {"app": "target"}))
        cluster.apply(probe_pod("walker", labels))
        cluster.ready("target", "walker")
        cluster.fenced_by("walker", set())
        target = cluster.ip("target")
        assert cluster.reaches("walker", target, PROBE_PORT)
        job = fenced_job(late, f"http://{node.host}:1")
        (harness_policy, *_) = network_policies(job, job_reach(job, OperatorConfig(), {}, cluster.service), None)
        harness_policy["metadata"].pop("ownerReferences")
        applied = time.monotonic()
        cluster.apply(harness_policy)
        while cluster.reaches("walker", target, PROBE_PORT):
            assert time.monotonic() - applied < 30, "the policy did not take effect in 30 s"
        took = time.monotonic() - applied

        # a pod born under the policy: a connection every 50 ms from its container's first instant, timestamped (a
        # refused one waits out its 0.5 s: kube-router's REJECT answer does not get back into a fenced pod)
        loop = (f"for i in $(seq 40); do if timeout 0.5 bash -c 'exec 3<>/dev/tcp/{target}/{PROBE_PORT}'; "
                "then echo $(date +%s.%N) open; else echo $(date +%s.%N) closed; fi; sleep 0.05; done")
        cluster.apply({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": "newcomer", "namespace": NAMESPACE, "labels": labels},
                       "spec": {"restartPolicy": "Never", "containers": [
                           {"name": "c", "image": BASE_IMAGE, "imagePullPolicy": "Never",
                            "command": ["bash", "-c", loop]}]}})
        deadline = time.monotonic() + 90
        while pod_status(node, NAMESPACE, "newcomer").get("phase") not in ("Succeeded", "Failed"):
            assert time.monotonic() < deadline, pod_status(node, NAMESPACE, "newcomer")
            time.sleep(0.5)
        tries = [line.split() for line in cluster.kube.kubectl("-n", NAMESPACE, "logs", "newcomer").stdout.splitlines()]
        assert len(tries) == 40 and tries[-1][1] == "closed", tries
        opened = [float(t) for t, result in tries if result == "open"]
        window = opened[-1] - float(tries[0][0]) if opened else 0.0
        print(f"a policy in effect on a running pod {took:.1f} s after kubectl apply; a new pod under it: "
              f"{len(opened)} of its first connections let through, the last {window:.2f} s after its first")
    finally:
        cluster.kube.kubectl("-n", NAMESPACE, "delete", "pod,networkpolicy", "--all", "--wait=false")
