"""The real node's own parts (tests/fixtures/node.py): the CNI gives every pod its own network namespace and address,
pods reach this machine's address, the API server reaches the kubelet (`kubectl logs`), Service names resolve in
pods (cluster DNS) and lead to the pods behind them (kube-proxy)."""

from __future__ import annotations

import http.server
import ipaddress
import json
import threading
import time

from fixtures.node import CLUSTER_DOMAIN, POD_SUBNET, echo_server, pod_status
from tracefleet.runner.containers.runtime import BASE_IMAGE


def test_pods_get_an_address_each_and_reach_this_machine(node, container_runtime) -> None:
    """The CNI's part: two pods, each in its own network namespace with its own address on the pod subnet, reach a
    server on this machine's address (where the tests put the engine and the bucket)."""
    node.load_image(container_runtime, BASE_IMAGE)
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.client_address[0])
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer((node.host, 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    script = (f"exec 3<>/dev/tcp/{node.host}/{srv.server_address[1]}; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; "
              "head -1 <&3")
    names = ["probe-a", "probe-b"]
    try:
        for name in names:
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                   "spec": {"restartPolicy": "Never", "containers": [
                       {"name": "c", "image": BASE_IMAGE, "imagePullPolicy": "Never",
                        "command": ["bash", "-c", script]}]}}
            assert node.kube.kubectl("apply", "-f", "-", input=json.dumps(pod)).returncode == 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(pod_status(node, "default", p).get("phase") != "Succeeded"
                                                  for p in names):
            time.sleep(0.5)
        statuses = [pod_status(node, "default", p) for p in names]
        assert [s.get("phase") for s in statuses] == ["Succeeded"] * 2, statuses
        addresses = [s["podIP"] for s in statuses]
        assert len(set(addresses)) == 2 and all(ipaddress.ip_address(a) in ipaddress.ip_network(POD_SUBNET)
                                                for a in addresses), addresses
        assert sorted(seen) == sorted(addresses)  # each came from its own address, no NAT on the way
        logs = node.kube.kubectl("logs", "probe-a").stdout  # the API server reaches the kubelet
        assert logs.startswith("HTTP/1.0 204"), logs
    finally:
        srv.shutdown()
        node.kube.kubectl("delete", "pod", *names, "--wait=false")


def test_a_service_name_leads_a_pod_to_another_pod_and_to_the_api_server(node, container_runtime) -> None:
    """Cluster DNS and kube-proxy: a pod reaches another pod through a Service's name, and the API server through the
    `kubernetes` Service's short name (the pod's search path), as an in-cluster client (the operator's pod) does."""
    node.load_image(container_runtime, BASE_IMAGE)
    server = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "echo", "namespace": "default",
                                                              "labels": {"app": "echo"}},
              "spec": {"containers": [{"name": "c", "image": BASE_IMAGE, "imagePullPolicy": "Never",
                                       "command": ["sh", "-c", echo_server()],
                                       "env": [{"name": "POD_IP",
                                                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                                       "ports": [{"containerPort": 8080}],
                                       "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}]}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": "default"},
               "spec": {"selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": 8080}]}}
    try:
        for obj in (server, service):
            assert node.kube.kubectl("apply", "-f", "-", input=json.dumps(obj)).returncode == 0
        assert node.kube.kubectl("wait", "--for=condition=Ready", "pod/echo", "--timeout=60s").returncode == 0
        cluster_ip = node.kube.kubectl("get", "service", "echo", "-o", "jsonpath={.spec.clusterIP}").stdout
        name = f"echo.default.svc.{CLUSTER_DOMAIN}"
        script = (f"getent hosts {name}; exec 3<>/dev/tcp/{name}/80; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; "
                  "tail -1 <&3; exec 4<>/dev/tcp/kubernetes.default/443 && echo api-reachable")
        client = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "namespace": "default"},
                  "spec": {"restartPolicy": "Never", "containers": [
                      {"name": "c", "image": BASE_IMAGE, "imagePullPolicy": "Never",
                       "command": ["bash", "-c", script]}]}}
        assert node.kube.kubectl("apply", "-f", "-", input=json.dumps(client)).returncode == 0
        deadline = time.monotonic() + 60
        while (time.monotonic() < deadline
               and pod_status(node, "default", "client").get("phase") not in ("Succeeded", "Failed")):
            time.sleep(0.5)
        echo_ip = pod_status(node, "default", "echo")["podIP"]
        logs = node.kube.kubectl("logs", "client").stdout.split()
        assert logs == [cluster_ip, name, echo_ip, "api-reachable"], (logs, pod_status(node, "default", "client"))
    finally:
        node.kube.kubectl("delete", "pod,service", "echo", "--wait=false")
        node.kube.kubectl("delete", "pod", "client", "--wait=false")
