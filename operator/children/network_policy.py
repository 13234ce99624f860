"""The per-job NetworkPolicies: the job's (the engine, the bucket, DNS) for every harness pod; DNS and the bucket only for
its batch pods (evaluators, which run the agent's change set, and sealers); and the internet for the pods whose phase
asks for network "public" (a Harbor task's agent or verifier, a hook evaluator's judge). NetworkPolicies add up: a pod
two select may reach what either allows. docs/harbor/cluster-network.md has what they leave.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Literal
from urllib.parse import urlparse

from tracefleet.contract.harbor import PUBLIC_NETWORK
from tracefleet.contract.job import RolloutJob
from tracefleet.operator import names as n
from tracefleet.operator.children.inference import ENGINE_PORT
from tracefleet.operator.children.metadata import Manifest, metadata
from tracefleet.operator.config import OperatorConfig
from tracefleet.operator.harbor_tasks import HarborSource, ClusterHarborTask

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
    return {n.LABEL_NETWORK: PUBLIC_NETWORK} if task is not None and task.config.network(phase) == PUBLIC_NETWORK else {}


def evaluator_network_labels(job: RolloutJob) -> dict[str, str]:
    """A non-Harbor evaluator's pod: the public label for preset hook only. A hook may call a judge model, which no
    field of the job names: the internet it gets (the cluster's own addresses left out, the engine's included); a
    judge inside the cluster needs the platform's own policy for the job's evaluator pods. The tests and command
    presets run the agent's patch and a program: DNS and the bucket only."""
    e = job.spec.evaluator
    return {n.LABEL_NETWORK: PUBLIC_NETWORK} if e is not None and e.preset == "hook" else {}


def network_policies(job: RolloutJob, cfg: OperatorConfig, harbor: HarborSource | None) -> list[Manifest]:
    """The harness pods' policy and the sealers'; the evaluators' for a job that has them; the public one where some
    pod carries its label."""
    evaluated = harbor is not None or job.spec.evaluator is not None
    public = (any(network_labels(t, phase) for t in harbor.tasks for phase in ("agent", "verifier")) if harbor is not None
              else bool(evaluator_network_labels(job)))
    return [harness_network_policy(job, cfg), batch_network_policy(job, cfg, n.COMPONENT_SEALER),
            *([batch_network_policy(job, cfg, n.COMPONENT_EVALUATOR)] if evaluated else []),
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
    return _policy(job, n.public_network_policy_name(job.name), n.COMPONENT_HARNESS, {n.LABEL_NETWORK: PUBLIC_NETWORK},
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


BATCH_POLICY_NAMES = {n.COMPONENT_EVALUATOR: n.evaluator_network_policy_name, n.COMPONENT_SEALER: n.sealer_network_policy_name}


def batch_network_policy(job: RolloutJob, cfg: OperatorConfig, component: str) -> Manifest:
    """The job's evaluator or sealer pods: no ingress, egress only to DNS and the bucket (what their steps read and
    write). An evaluator runs the agent's change set (a Harbor task's test.sh as root): not the engine, nor anything
    else of the cluster's."""
    return _policy(job, BATCH_POLICY_NAMES[component](job.name), component, {n.LABEL_COMPONENT: component},
                   _dns_and_bucket(job, cfg))


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
