"""The engine replicas behind a Kubernetes Service: what a trainer's weight sync updates on a cluster.

A RolloutJob's managed vLLM is a Deployment of `replicas` pods behind the Service `<job>-inference` (port
`http`). A weight sync must reach every pod, not the Service's one virtual IP (which would pause, reload and
label a random replica per call). The pods come from the Service's EndpointSlices (discovery.k8s.io/v1, label
`kubernetes.io/service-name`), as kube-proxy sees them: every endpoint that is not marked not-ready, at the
port named `http` (or the slice's only port).

    replicas = service_replicas("ns", "my-job-inference")        # [Replica(url, pod), ...]
    report = update_policy([r.url for r in replicas], "/ckpt/policy-3", 3, check=False)

`tracefleet policy update --service NS/NAME` (or `--job NS/JOB`) does both; the report's per-engine steps and
in-flight counts are then per replica, and `pods` maps each replica's URL to its pod. The trainer must reach
the pod IPs (run it in the cluster, or beside it on the pod network). Each replica's port is the engine gate's, which
lets only the job's engine key through: `job_engine_key` reads it from the job's Secret.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # set by the EndpointSlice controller on a Service's slices
ENGINE_PORT_NAME = "http"  # the managed inference Service's port (tracefleet.operator.children.inference)


class NoReplicas(RuntimeError):
    """The Service has no ready endpoint (or does not exist): nothing to update."""


@dataclass(frozen=True)
class Replica:
    url: str  # http://<pod ip>:<port>
    pod: str | None  # the endpoint's targetRef name, when it names a pod


def split_ref(ref: str, default_namespace: str = "default") -> tuple[str, str]:
    """'NS/NAME' or 'NAME' -> (namespace, name)."""
    namespace, _, name = ref.rpartition("/")
    if not name or "/" in namespace:
        raise ValueError(f"{ref!r}: expected NAMESPACE/NAME or NAME")
    return namespace or default_namespace, name


def inference_service_name(job: str) -> str:
    """The Service the operator gives a job's managed vLLM."""
    from tracefleet.operator.names import inference_name

    return inference_name(job)


def kube_api_client() -> Any:
    """A client for the cluster this process runs in, else the kubeconfig's current context."""
    from kubernetes import client

    from tracefleet.cluster_config import load_cluster_config

    try:
        load_cluster_config()
    except SystemExit as exc:  # this module's callers answer a ValueError in their own words
        raise ValueError(str(exc)) from None
    return client.ApiClient()


def _port(ports: list[Any] | None, port_name: str) -> int | None:
    ports = ports or []
    named = [p.port for p in ports if p.name == port_name and p.port]
    if named:
        return named[0]
    return ports[0].port if len(ports) == 1 and ports[0].port else None


def service_replicas(namespace: str, service: str, *, api_client: Any = None, port_name: str = ENGINE_PORT_NAME,
                     scheme: str = "http") -> list[Replica]:
    """Every ready endpoint of the Service's EndpointSlices, as engine root URLs (sorted, no duplicates).
    NoReplicas when there is none."""
    from kubernetes import client

    api = client.DiscoveryV1Api(api_client or kube_api_client())
    slices = api.list_namespaced_endpoint_slice(namespace, label_selector=f"{SERVICE_NAME_LABEL}={service}").items
    found: dict[str, Replica] = {}
    for sl in slices:
        port = _port(sl.ports, port_name)
        if port is None or sl.address_type not in ("IPv4", "IPv6"):
            continue
        for ep in sl.endpoints or []:
            if ep.conditions is not None and ep.conditions.ready is False:
                continue  # not serving: kube-proxy sends it nothing either
            if not ep.addresses:
                continue
            host = ep.addresses[0]
            host = f"[{host}]" if ":" in host else host
            url = f"{scheme}://{host}:{port}"
            pod = ep.target_ref.name if ep.target_ref is not None and ep.target_ref.kind == "Pod" else None
            found[url] = Replica(url=url, pod=pod)
    if not found:
        why = "no EndpointSlice" if not slices else f"no ready endpoint with a port named {port_name!r}"
        raise NoReplicas(f"service {namespace}/{service}: {why} (is the inference Deployment up?)")
    return [found[u] for u in sorted(found)]


def job_engine_key(namespace: str, job: str, *, api_client: Any = None) -> str | None:
    """The engine key of a RolloutJob's managed inference, which the gate in front of each replica asks for: from the
    job's apiKeySecretRef, else the Secret the operator made for it. None when there is no such RolloutJob (an engine
    Service of another making); ValueError, in one line, when the Secret cannot be read."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from tracefleet.operator import names as n
    from tracefleet.operator.body import job_of
    from tracefleet.operator.children.inference import engine_key_ref

    api = api_client or kube_api_client()
    try:
        body = client.CustomObjectsApi(api).get_namespaced_custom_object(n.GROUP, n.VERSION, namespace, n.PLURAL, job)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise ValueError(f"cannot read RolloutJob {namespace}/{job} for its engine key: {exc.status} {exc.reason}") from None
    if (ref := engine_key_ref(job_of(body))) is None:
        return None
    try:
        data = client.CoreV1Api(api).read_namespaced_secret(ref.name, namespace).data or {}
    except ApiException as exc:
        raise ValueError(f"cannot read Secret {namespace}/{ref.name} (the engine key of {job}): {exc.status} "
                         f"{exc.reason}; or set the key in $VLLM_API_KEY") from None
    if ref.key not in data:
        raise ValueError(f"Secret {namespace}/{ref.name} has no key {ref.key!r} (the engine key of {job})")
    return base64.b64decode(data[ref.key]).decode()
