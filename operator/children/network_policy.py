"""The per-job NetworkPolicy that fences harness pods in."""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlparse

from tracefleet.contract.job import RolloutJob
from tracefleet.operator import names as n
from tracefleet.operator.children.inference import ENGINE_PORT
from tracefleet.operator.children.metadata import Manifest, metadata
from tracefleet.operator.config import OperatorConfig


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


def harness_network_policy(job: RolloutJob, cfg: OperatorConfig) -> Manifest:
    """Harness pods: no ingress at all; egress only to the inference pods, the bucket and DNS.

    The harness and its proxy share a pod network namespace, so the pod-level policy is what the
    proxy needs; the harness reaches the proxy over loopback, which no policy can (or needs to) see.
    """
    egress: list[dict[str, Any]] = [
        {
            "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        }
    ]
    inference = job.spec.inference
    if inference.managed is not None:
        egress.append(
            {
                "to": [{"podSelector": {"matchLabels": {n.LABEL_JOB: job.name, n.LABEL_COMPONENT: n.COMPONENT_INFERENCE}}}],
                "ports": [{"protocol": "TCP", "port": ENGINE_PORT}],
            }
        )
    else:
        peers, ports = _endpoint_peer(inference.external.base_url if inference.external else None)
        egress.append({**({"to": peers} if peers else {}), "ports": ports})
    if cfg.bucket_endpoint or job.spec.output.uri.startswith("s3://"):
        peers, ports = _endpoint_peer(cfg.bucket_endpoint or "https://s3.amazonaws.com")
        egress.append({**({"to": peers} if peers else {}), "ports": ports})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(job, n.network_policy_name(job.name), n.COMPONENT_HARNESS),
        "spec": {
            "podSelector": {"matchLabels": {n.LABEL_JOB: job.name, n.LABEL_COMPONENT: n.COMPONENT_HARNESS}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }
