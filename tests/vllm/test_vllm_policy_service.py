"""A weight sync on a cluster reaches every replica behind the inference Service, resolved from its
EndpointSlices on the test control plane (`kube`), the replicas being real vLLM (the session's `vllm_server`).

Two replicas are two EndpointSlice endpoints, each a TCP relay on this machine's non-loopback address (the API
server refuses loopback endpoint addresses) to the one real vLLM: `tracefleet policy update --job NS/JOB`
resolves both from the Service the operator names for the job, pauses, reloads, labels and resumes each, and
reports per replica with its pod; an endpoint marked not ready and another Service's slice are left alone.
"""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from tracefleet.cli import main as cli_main
from tracefleet.contract.policy import label_version
from tracefleet.trainer import EngineControl
from tracefleet.trainer.replicas import SERVICE_NAME_LABEL, inference_service_name, service_replicas

from fixtures.checkpoints import changed_checkpoint, restore_served_weights
from fixtures.proxy_on_vllm import served_model_dir

NAMESPACE = "policy-sync"
JOB = "loop"


class Relay:
    """TCP on (host, any port) relayed to `target`: one more address for the same engine."""

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server((host, 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()


def host_address() -> str:
    """This machine's first non-loopback IPv4 address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        return s.getsockname()[0]


def endpoint_slice(name: str, service: str, port: int, endpoints: list[tuple[str, str, bool]]) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": name, "labels": {SERVICE_NAME_LABEL: service}},
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": ready},
                           "targetRef": {"kind": "Pod", "name": pod, "namespace": NAMESPACE}}
                          for ip, pod, ready in endpoints]}


def test_policy_update_reaches_every_replica_behind_the_service(kube: Any, vllm_server: Any, tmp_path: Path,
                                                               capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes import client

    host = host_address()
    assert not host.startswith("127."), host
    port = int(vllm_server.url.rsplit(":", 1)[1])
    relays = [Relay(host, ("127.0.0.1", port)) for _ in range(2)]
    api = kube.api_client()
    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    service = inference_service_name(JOB)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    core.create_namespaced_service(NAMESPACE, {"metadata": {"name": service},
                                               "spec": {"ports": [{"name": "http", "port": 8000}]}})
    discovery.create_namespaced_endpoint_slice(NAMESPACE, endpoint_slice(
        "a", service, relays[0].port, [(host, "loop-inference-a", True), ("192.0.2.77", "loop-inference-c", False)]))
    discovery.create_namespaced_endpoint_slice(NAMESPACE, endpoint_slice("b", service, relays[1].port,
                                                                         [(host, "loop-inference-b", True)]))
    discovery.create_namespaced_endpoint_slice(NAMESPACE, endpoint_slice("other", "other-svc", port,
                                                                         [("192.0.2.78", "x", True)]))
    expected = sorted(zip((f"http://{host}:{r.port}" for r in relays), ["loop-inference-a", "loop-inference-b"]))
    urls = [url for url, _ in expected]
    replicas = service_replicas(NAMESPACE, service, api_client=api)
    assert [(r.url, r.pod) for r in replicas] == expected

    model_dir = Path(served_model_dir(vllm_server.url))
    ckpt = changed_checkpoint(model_dir, tmp_path / "policy-1", scale=0.5)
    engine = EngineControl(vllm_server.url)
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    try:
        capsys.readouterr()
        status = cli_main(["policy", "update", "--job", f"{NAMESPACE}/{JOB}", "--weights", str(ckpt), "--version", "1",
                           "--json"])
        printed = capsys.readouterr()
        assert status == 0, printed.err
        report = json.loads(printed.out)
        assert report["pods"] == {r.url: r.pod for r in replicas}
        for url in urls:  # every step on every replica
            assert {s["step"] for s in report["steps"] if s["engine"] == url and s["ok"]} >= \
                {"pause", "load", "version", "resume"}, report["steps"]
        order = [s["step"] for s in report["steps"]]
        assert order[:2] == ["pause", "pause"] and order.count("load") == 2  # in lockstep: all paused before any load
        assert sorted(f["engine"] for f in report["in_flight"]) == urls
        assert label_version(engine.label()) == 1 and engine.label() == report["label"] and not engine.is_paused()
    finally:  # the server is shared by the session's tests: its own weights and label back
        restore_served_weights(engine, model_dir)
        for r in relays:
            r.close()
        core.delete_namespace(NAMESPACE)
    print(f"policy update over 2 replicas: {report['seconds']:.2f} s, paused {report['paused_seconds']:.2f} s")
