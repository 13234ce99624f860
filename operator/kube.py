"""The few Kubernetes API calls the reconcile makes, counted (metrics + the bench's requests/session).

A failed call says whether retrying can help, as kopf's errors (the reconcile timer acts on them):
`kopf.PermanentError` when the API server refuses the object itself (the same spec would build the
same object again), `kopf.TemporaryError` otherwise - an overloaded or restarting API server, a
conflict, a lost connection, missing RBAC that an administrator can grant - with the delay it asks for.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError as TransportError

from tracefleet.operator import metrics
from tracefleet.operator import names as n

# Retry an API server that is overloaded or restarting this soon, unless it says (Retry-After).
API_RETRY_DELAY_S = 5.0
# Missing RBAC or credentials are fixed by an administrator, not by retrying at once.
FORBIDDEN_RETRY_DELAY_S = 60.0
# The object is invalid or too large: building it again from the same spec cannot succeed.
REFUSED_STATUSES = (400, 413, 422)


def _api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.body or "").strip()[:500]


def _retry_after(exc: ApiException) -> float | None:
    try:
        return float((exc.headers or {}).get("Retry-After"))
    except (TypeError, ValueError):
        return None


def retry_intent(exc: ApiException | TransportError, what: str) -> kopf.TemporaryError | kopf.PermanentError:
    """The kopf error saying whether `what` (e.g. "create pods team/demo-s0-a0") is worth retrying."""
    if isinstance(exc, TransportError):
        return kopf.TemporaryError(f"{what}: API server unreachable: {exc}", delay=API_RETRY_DELAY_S)
    text = f"{what}: {exc.status} {exc.reason}: {_api_message(exc)}"
    if exc.status in REFUSED_STATUSES:
        return kopf.PermanentError(text)
    if exc.status in (401, 403):
        return kopf.TemporaryError(f"{text} (the operator's RBAC or credentials)", delay=FORBIDDEN_RETRY_DELAY_S)
    return kopf.TemporaryError(text, delay=_retry_after(exc) or API_RETRY_DELAY_S)


class Kube:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.net = client.NetworkingV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.calls = 0
        self._lock = threading.Lock()

    def _call(self, verb: str, kind: str, what: str, fn: Any, *args: Any, ok: tuple[int, ...] = (), **kw: Any) -> Any:
        """`fn(*args)`, counted; the ApiException when its status is in `ok` (the caller's answer for it),
        else the kopf error saying whether to retry."""
        metrics.API_CALLS.labels(verb, kind).inc()
        with self._lock:
            self.calls += 1
        try:
            return fn(*args, _preload_content=False, **kw)
        except ApiException as e:
            if e.status in ok:
                return e
            raise retry_intent(e, f"{verb} {kind} {what}") from e
        except TransportError as e:
            raise retry_intent(e, f"{verb} {kind} {what}") from e

    # ---- reads (raw JSON dicts: no model deserialisation cost at scale)

    def _json(self, verb: str, kind: str, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        """The object as JSON, or None when it does not exist."""
        resp = self._call(verb, kind, what, fn, *args, ok=(404,), **kw)
        return None if isinstance(resp, ApiException) else json.loads(resp.data)

    def list_pods(self, ns: str, selector: str) -> list[dict[str, Any]]:
        return self._json("list", "pods", f"{ns} {selector}", self.core.list_namespaced_pod, ns, label_selector=selector)["items"]

    def list_jobs(self, ns: str, selector: str) -> list[dict[str, Any]]:
        return self._json("list", "jobs", f"{ns} {selector}", self.batch.list_namespaced_job, ns, label_selector=selector)["items"]

    def get_deployment(self, ns: str, name: str) -> dict[str, Any] | None:
        return self._json("get", "deployments", f"{ns}/{name}", self.apps.read_namespaced_deployment, name, ns)

    def get_configmap(self, ns: str, name: str) -> dict[str, Any] | None:
        return self._json("get", "configmaps", f"{ns}/{name}", self.core.read_namespaced_config_map, name, ns)

    def get_secret_data(self, ns: str, name: str) -> dict[str, str] | None:
        import base64

        s = self._json("get", "secrets", f"{ns}/{name}", self.core.read_namespaced_secret, name, ns)
        if s is None:
            return None
        return {k: base64.b64decode(v).decode() for k, v in (s.get("data") or {}).items()}

    # ---- writes

    def create(self, manifest: dict[str, Any]) -> bool:
        """Create a child; False when it already exists (deterministic names make this the dedupe)."""
        kind = manifest["kind"]
        ns = manifest["metadata"]["namespace"]
        fn = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "Deployment": self.apps.create_namespaced_deployment,
            "Job": self.batch.create_namespaced_job,
            "NetworkPolicy": self.net.create_namespaced_network_policy,
        }[kind]
        resp = self._call("create", kind.lower(), f"{ns}/{manifest['metadata']['name']}", fn, ns, manifest, ok=(409,))
        return not isinstance(resp, ApiException)

    def create_many(self, manifests: list[dict[str, Any]], workers: int = 16) -> list[bool]:
        """Creates in parallel (bounded pool): at parallelism 500 one-by-one creates dominate start-up time."""
        if len(manifests) <= 1:
            return [self.create(m) for m in manifests]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(workers, len(manifests))) as pool:
            return list(pool.map(self.create, manifests))

    def delete_pod(self, ns: str, name: str) -> None:
        self._call("delete", "pods", f"{ns}/{name}", self.core.delete_namespaced_pod, name, ns, grace_period_seconds=30, ok=(404,))

    def scale_deployment(self, ns: str, name: str, replicas: int) -> None:
        self._call("patch", "deployments", f"{ns}/{name}", self.apps.patch_namespaced_deployment, name, ns,
                   {"spec": {"replicas": replicas}})

    def annotate_job(self, ns: str, name: str, annotations: dict[str, str]) -> None:
        self._call("patch", "jobs", f"{ns}/{name}", self.batch.patch_namespaced_job, name, ns,
                   {"metadata": {"annotations": annotations}})

    def delete_rolloutjob(self, ns: str, name: str) -> None:
        self._call("delete", "rolloutjobs", f"{ns}/{name}", self.custom.delete_namespaced_custom_object,
                   n.GROUP, n.VERSION, ns, n.PLURAL, name, propagation_policy="Background", ok=(404,))
