"""The per-job NetworkPolicies: the job's (the engine, the bucket, DNS) for every harness pod; DNS and the bucket only for
its batch pods (evaluators, which run the agent's change set, and sealers); and the internet for the pods whose phase
asks for network "public" (a Harbor task's agent or verifier, a hook evaluator's judge). NetworkPolicies add up: a pod
two select may reach what either allows. docs/harbor/cluster-network.md has what they leave.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import ParseResult, urlparse

from tracefleet.bucket import endpoint_from_env
from tracefleet.contract import environment
from tracefleet.contract.harbor import PUBLIC_NETWORK
from tracefleet.contract.job import RolloutJob
from tracefleet.operator import names as n
from tracefleet.operator.children.inference import ENGINE_PORT
from tracefleet.operator.children.metadata import Manifest, metadata, namespace_of
from tracefleet.operator.config import OperatorConfig
from tracefleet.operator.harbor_tasks import HarborSource, ClusterHarborTask

# Harbor's "public" is the internet, not the cluster: private and shared ranges (pods, Services and nodes on most
# clusters) and link-local (the cloud's metadata service and the node credentials it hands out) stay out.
NOT_PUBLIC = {4: ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"],
              6: ["fc00::/7", "fe80::/10"]}


# Every namespace carries its own name as this label (the API server sets it): a peer in one named namespace.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
# Where boto3 sends an s3:// bucket whose endpoint nothing names.
AWS_S3_ENDPOINT = "https://s3.amazonaws.com"
# Where a host name may name a Service of the cluster (the pods' DNS search path: NAME, NAME.NS, NAME.NS.svc[.DOMAIN]).
SERVICE_HOST = re.compile(r"^(?P<name>[a-z0-9]([-a-z0-9]*[a-z0-9])?)(\.(?P<namespace>[a-z0-9]([-a-z0-9]*[a-z0-9])?)(\.svc(\..+)?)?)?$")
ServiceLookup = Callable[[str, str], "dict[str, Any] | None"]  # (namespace, name) -> the Service, None if unknown
Egress = list[dict[str, Any]]


@dataclass(frozen=True)
class Reach:
    """What a job's pods are given to reach outside their own pods' selectors, as egress rules: the bucket (None: a
    local folder, nothing to reach) and an external engine (None: the job's managed one)."""
    bucket: Egress | None
    engine: Egress | None


def _parsed(url: str) -> ParseResult:
    """An endpoint URL; a bare host[:port] is taken as https, as the engine and bucket clients take it."""
    return urlparse(url if "://" in url else f"https://{url}")


def _ip_block(address: str) -> dict[str, Any]:
    """A peer of exactly one address."""
    ip = ipaddress.ip_address(address)
    return {"ipBlock": {"cidr": f"{ip}/{32 if ip.version == 4 else 128}"}}


def service_of(host: str, namespace: str) -> tuple[str, str] | None:
    """(namespace, name) of the Service `host` names from a pod of `namespace`, if it can name one at all."""
    m = SERVICE_HOST.match(host)
    return None if m is None else (m["namespace"] or namespace, m["name"])


def endpoint_egress(url: str, service: dict[str, Any] | None = None) -> Egress:
    """Egress rules that let a pod reach `url`, whatever its scheme and port.

    A Service of the cluster (`service`, the object the URL's host names) is reached at its pods on the target ports
    behind the URL's port (where policies are enforced after kube-proxy's DNAT, as Calico and Cilium do) and at its
    cluster IP on its own port (where they are enforced before). An IP literal gets a /32 ipBlock; any other name
    only the port: NetworkPolicy cannot match host names (the DNS rule lets it resolve)."""
    u = _parsed(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    ports = [{"protocol": "TCP", "port": port}]
    try:
        return [{"to": [_ip_block(u.hostname or "")], "ports": ports}]
    except ValueError:
        pass
    spec = (service or {}).get("spec") or {}
    if not spec.get("selector"):  # no Service, or one without pods of its own (ExternalName, manual Endpoints)
        return [{"ports": ports}]
    targets = [p.get("targetPort", p["port"]) for p in spec.get("ports") or [] if p.get("port") == port] or [port]
    rules: Egress = [{"to": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: service["metadata"]["namespace"]}},
                              "podSelector": {"matchLabels": spec["selector"]}}],
                      "ports": [{"protocol": "TCP", "port": t} for t in dict.fromkeys(targets)]}]
    if (vip := spec.get("clusterIP")) and vip != "None":
        rules.append({"to": [_ip_block(vip)], "ports": ports})
    return rules


def bucket_endpoint(job: RolloutJob, cfg: OperatorConfig, secret_env: Mapping[str, str] | None) -> str | None:
    """The S3 endpoint the job's pods reach the bucket at: what their environment makes of the operator's
    --bucket-endpoint (TRACEFLEET_S3_ENDPOINT on every pod) and the credentials Secret (envFrom), by the one precedence
    the bucket client uses; AWS's for an s3:// output that names none; None for a folder."""
    if not job.spec.output.uri.startswith("s3://"):
        return None
    pod_env = {**(secret_env or {}), **({environment.S3_ENDPOINT: cfg.bucket_endpoint} if cfg.bucket_endpoint else {})}
    return endpoint_from_env(pod_env) or AWS_S3_ENDPOINT


def job_reach(job: RolloutJob, cfg: OperatorConfig, secret_env: Mapping[str, str] | None,
              lookup: ServiceLookup) -> Reach:
    """The job's Reach, looking up the Services its endpoints name (in the job's namespace unless they say another)."""

    def egress(url: str | None) -> Egress | None:
        if not url:
            return None
        where = service_of(_parsed(url).hostname or "", namespace_of(job))
        return endpoint_egress(url, lookup(*where) if where else None)

    external = job.spec.inference.external
    return Reach(bucket=egress(bucket_endpoint(job, cfg, secret_env)), engine=egress(external.base_url if external else None))


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


def network_policies(job: RolloutJob, reach: Reach, harbor: HarborSource | None) -> list[Manifest]:
    """The harness pods' policy and the sealers'; the evaluators' for a job that has them; the public one where some
    pod carries its label."""
    evaluated = harbor is not None or job.spec.evaluator is not None
    public = (any(network_labels(t, phase) for t in harbor.tasks for phase in ("agent", "verifier")) if harbor is not None
              else bool(evaluator_network_labels(job)))
    return [harness_network_policy(job, reach), batch_network_policy(job, reach, n.COMPONENT_SEALER),
            *([batch_network_policy(job, reach, n.COMPONENT_EVALUATOR)] if evaluated else []),
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


def _dns_and_bucket(reach: Reach) -> Egress:
    """DNS on any pod of the cluster, whatever its labels (CoreDNS, kube-dns, a vendor's), then the bucket."""
    dns = {"to": [{"namespaceSelector": {}}], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    return [dns, *(reach.bucket or [])]


BATCH_POLICY_NAMES = {n.COMPONENT_EVALUATOR: n.evaluator_network_policy_name, n.COMPONENT_SEALER: n.sealer_network_policy_name}


def batch_network_policy(job: RolloutJob, reach: Reach, component: str) -> Manifest:
    """The job's evaluator or sealer pods: no ingress, egress only to DNS and the bucket (what their steps read and
    write). An evaluator runs the agent's change set (a Harbor task's test.sh as root): not the engine, nor anything
    else of the cluster's."""
    return _policy(job, BATCH_POLICY_NAMES[component](job.name), component, {n.LABEL_COMPONENT: component},
                   _dns_and_bucket(reach))


def harness_network_policy(job: RolloutJob, reach: Reach) -> Manifest:
    """Harness pods: no ingress at all; egress only to the inference pods, the bucket and DNS.

    The harness and its proxy share a pod network namespace, so the pod-level policy is what the
    proxy needs; the harness reaches the proxy over loopback, which no policy can (or needs to) see.
    What that leaves the agent (the engine's port itself): docs/harbor/cluster-network.md.
    """
    dns, *bucket = _dns_and_bucket(reach)
    engine = reach.engine if job.spec.inference.managed is None else [{
        "to": [{"podSelector": {"matchLabels": {n.LABEL_JOB: job.name, n.LABEL_COMPONENT: n.COMPONENT_INFERENCE}}}],
        "ports": [{"protocol": "TCP", "port": ENGINE_PORT}],
    }]
    egress = [dns, *(engine or []), *bucket]
    return _policy(job, n.network_policy_name(job.name), n.COMPONENT_HARNESS, {n.LABEL_COMPONENT: n.COMPONENT_HARNESS}, egress)
