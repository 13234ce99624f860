"""The per-job NetworkPolicies that fence harness pods in: the job's (proxy's engine, bucket, DNS) for every harness pod,
and a second one, the internet, for the pods of Harbor tasks whose agent phase asks for network "public"
(NetworkPolicies add up: a pod both select may reach what either allows)."""

from __future__ import annotations

import ipaddress
from typing import Any, Literal
from urllib.parse import urlparse

from tracefleet.contract.job import RolloutJob
from tracefleet.operator import names as n
from tracefleet.operator.children.inference import ENGINE_PORT
from tracefleet.operator.children.metadata import Manifest, metadata
from tracefleet.operator.config import OperatorConfig
from tracefleet.operator.harbor_tasks import HarborSource, ClusterHarborTask

PUBLIC = "public"  # tracefleet.contract.harbor.NetworkMode's
# Harbor's "public" is the internet, not the cluster: private and shared ranges (pods, Services and nodes on most
# clusters) and link-local (the cloud's metadata service and the node credentials it hands out) stay out.
NOT_PUBLIC = {4: ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"],
              6: ["fc00::/7", "fe80::/10"]}


def _endpoint_peer(url: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """NetworkPolicy peers + ports for a URL outside the cluster's pod selectors.

    NetworkPolicy cannot match host names: an IP literal gets a /32 ipBlock, a name gets the
    port only (the DNS rule lets it resolve)."""
    if not url:
        return [], []
    u = urlparse(url if "://" in url else f"https://{url}")
    port = u.port or (443 if u.scheme == "https" else 80)
    host = u.hostname or ""
    try:
        ip = ipaddress.ip_address(host)
        peers = [{"ipBlock": {"cidr": f"{ip}/{32 if ip.version == 4 else 128}"}}]
    except ValueError:
        peers = []
    return peers, [{"protocol": "TCP", "port": port}]


def network_labels(task: ClusterHarborTask | None, phase: Literal["agent", "verifier"]) -> dict[str, str]:
    """The pod label the public policy selects: only for a Harbor task whose phase (the agent's: its harness pod; the
    verifier's: its evaluator Job's pod) has network "public" (task.toml's phase, else [environment]). "allowlist"
    names hosts, which a NetworkPolicy cannot match: it stays without the internet, as locally."""
    return {n.LABEL_NETWORK: PUBLIC} if task is not None and task.config.network(phase) == PUBLIC else {}


def network_policies(job: RolloutJob, cfg: OperatorConfig, harbor: HarborSource | None) -> list[Manifest]:
    """The job's harness policy; for a Harbor job the verifier's (its evaluator pods run the agent's change set) and
    the public one where some task's pods carry its label."""
    if harbor is None:
        return [harness_network_policy(job, cfg)]
    public = any(network_labels(t, phase) for t in harbor.tasks for phase in ("agent", "verifier"))
    return [harness_network_policy(job, cfg), verifier_network_policy(job, cfg),
            *([public_network_policy(job)] if public else [])]


def _policy(job: RolloutJob, name: str, component: str, selector: dict[str, str], egress: list[dict[str, Any]],
            ingress: bool = True) -> Manifest:
    """Egress only to `egress`, and (`ingress`) no ingress at all."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(job, name, component),
        "spec": {"podSelector": {"matchLabels": {n.LABEL_JOB: job.name, **selector}},
                 "policyTypes": ["Ingress", "Egress"] if ingress else ["Egress"],
                 **({"ingress": []} if ingress else {}), "egress": egress},
    }


def public_network_policy(job: RolloutJob) -> Manifest:
    """Egress to the internet (NOT_PUBLIC left out) for the job's pods labelled network=public."""
    internet = [{"ipBlock": {"cidr": cidr, "except": NOT_PUBLIC[version]}} for version, cidr in ((4, "0.0.0.0/0"), (6, "::/0"))]
    return _policy(job, n.public_network_policy_name(job.name), n.COMPONENT_HARNESS, {n.LABEL_NETWORK: PUBLIC},
                   [{"to": internet}], ingress=False)


def _dns_and_bucket(job: RolloutJob, cfg: OperatorConfig) -> list[dict[str, Any]]:
    egress: list[dict[str, Any]] = [
        {
            "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        }
    ]
    if cfg.bucket_endpoint or job.spec.output.uri.startswith("s3://"):
        peers, ports = _endpoint_peer(cfg.bucket_endpoint or "https://s3.amazonaws.com")
        egress.append({**({"to": peers} if peers else {}), "ports": ports})
    return egress


def verifier_network_policy(job: RolloutJob, cfg: OperatorConfig) -> Manifest:
    """A Harbor job's evaluator pods: test.sh runs there with the agent's change set applied, so, as [verifier]
    network_mode's default says, no ingress and egress only to DNS and the bucket (the fetch and report steps)."""
    return _policy(job, n.verifier_network_policy_name(job.name), n.COMPONENT_EVALUATOR,
                   {n.LABEL_COMPONENT: n.COMPONENT_EVALUATOR}, _dns_and_bucket(job, cfg))


def harness_network_policy(job: RolloutJob, cfg: OperatorConfig) -> Manifest:
    """Harness pods: no ingress at all; egress only to the inference pods, the bucket and DNS.

    The harness and its proxy share a pod network namespace, so the pod-level policy is what the
    proxy needs; the harness reaches the proxy over loopback, which no policy can (or needs to) see.
    What that leaves the agent (the engine's port itself): docs/harbor/cluster-network.md.
    """
    egress = _dns_and_bucket(job, cfg)
    inference = job.spec.inference
    if inference.managed is not None:
        egress.insert(1, {
            "to": [{"podSelector": {"matchLabels": {n.LABEL_JOB: job.name, n.LABEL_COMPONENT: n.COMPONENT_INFERENCE}}}],
            "ports": [{"protocol": "TCP", "port": ENGINE_PORT}],
        })
    else:
        peers, ports = _endpoint_peer(inference.external.base_url if inference.external else None)
        egress.insert(1, {**({"to": peers} if peers else {}), "ports": ports})
    return _policy(job, n.network_policy_name(job.name), n.COMPONENT_HARNESS, {n.LABEL_COMPONENT: n.COMPONENT_HARNESS}, egress)
