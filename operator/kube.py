"""The few Kubernetes API calls the reconcile makes, counted (metrics + the bench's requests/session).

A failed call says whether retrying can help, as kopf's errors (the reconcile timer acts on them):
`kopf.PermanentError` when the API server refuses the object itself (the same spec would build the
same object again), `kopf.TemporaryError` otherwise - an overloaded or restarting API server, a
conflict, a lost connection, missing RBAC that an administrator can grant - with the delay it asks for.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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
# Creates in flight at once: enough to keep the API server busy, few enough for the client's connection pool.
CREATE_WORKERS = 16


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
        self._pool: ThreadPoolExecutor | None = None  # one pool for the process: no thread start-up per pass
        self._pool_lock = threading.Lock()

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

    def json_or_conflict(self, verb: str, kind: str, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        """The object as JSON; None when it does not exist; the ApiException of a 409 Conflict (someone
        else's write came first: the caller's answer, e.g. a Lease another replica took)."""
        resp = self._call(verb, kind, what, fn, *args, ok=(404, 409), **kw)
        if isinstance(resp, ApiException):
            return None if resp.status == 404 else resp
        return json.loads(resp.data)

    def list_pods(self, ns: str, selector: str) -> list[dict[str, Any]]:
        return self._json("list", "pods", f"{ns} {selector}", self.core.list_namespaced_pod, ns, label_selector=selector)["items"]

    def list_pods_raw(self, ns: str, selector: str) -> dict[str, Any]:
        """The whole list (its metadata.resourceVersion is where a watch starts)."""
        return self._json("list", "pods", f"{ns} {selector}", self.core.list_namespaced_pod, ns, label_selector=selector)

    def watch_pods(self, ns: str, selector: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        """The pod watch events from `resource_version` (with bookmarks) until the server ends the watch;
        one request, however many events."""
        resp = self._call("watch", "pods", f"{ns} {selector}", self.core.list_namespaced_pod, ns, label_selector=selector,
                          watch=True, resource_version=resource_version, allow_watch_bookmarks=True,
                          timeout_seconds=timeout_s, _request_timeout=(10, timeout_s + 30))
        try:
            buf = b""
            for chunk in resp.stream(64 * 1024, decode_content=True):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.release_conn()

    def list_jobs(self, ns: str, selector: str) -> list[dict[str, Any]]:
        return self._json("list", "jobs", f"{ns} {selector}", self.batch.list_namespaced_job, ns, label_selector=selector)["items"]

    def get_deployment(self, ns: str, name: str) -> dict[str, Any] | None:
        return self._json("get", "deployments", f"{ns}/{name}", self.apps.read_namespaced_deployment, name, ns)

    def get_configmap(self, ns: str, name: str) -> dict[str, Any] | None:
        return self._json("get", "configmaps", f"{ns}/{name}", self.core.read_namespaced_config_map, name, ns)

    def get_service(self, ns: str, name: str) -> dict[str, Any] | None:
        """The Service, or None when it does not exist or is not ours to read (a namespace the operator does not
        serve): the caller falls back to what it knows without it."""
        resp = self._call("get", "services", f"{ns}/{name}", self.core.read_namespaced_service, name, ns, ok=(403, 404))
        return None if isinstance(resp, ApiException) else json.loads(resp.data)

    def get_secret_data(self, ns: str, name: str) -> dict[str, str] | None:
        import base64

        s = self._json("get", "secrets", f"{ns}/{name}", self.core.read_namespaced_secret, name, ns)
        if s is None:
            return None
        return {k: base64.b64decode(v).decode() for k, v in (s.get("data") or {}).items()}

    # ---- writes

    def create(self, manifest: dict[str, Any]) -> bool:
        """Create a child; False when it already exists (deterministic names make this the dedupe)."""
        return self.create_object(manifest) is not None

    def create_many(self, manifests: list[dict[str, Any]], workers: int = CREATE_WORKERS) -> list[bool]:
        """Creates in parallel (bounded pool): at parallelism 500 one-by-one creates dominate start-up time."""
        return [body is not None for body in self.create_all(manifests, workers)]

    def create_object(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Create a child and return it as the API server stored it; None when it already exists."""
        kind = manifest["kind"]
        ns = manifest["metadata"]["namespace"]
        fn = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "Secret": self.core.create_namespaced_secret,
            "Deployment": self.apps.create_namespaced_deployment,
            "Job": self.batch.create_namespaced_job,
            "NetworkPolicy": self.net.create_namespaced_network_policy,
            "Event": self.core.create_namespaced_event,
        }[kind]
        resp = self._call("create", kind.lower(), f"{ns}/{manifest['metadata']['name']}", fn, ns, manifest, ok=(409,))
        return None if isinstance(resp, ApiException) else json.loads(resp.data)

    def create_all(self, manifests: list[dict[str, Any]], workers: int = CREATE_WORKERS) -> list[dict[str, Any] | None]:
        """`create_object` of each (any kind), `workers` at a time (round trips overlap; the API server does the work)."""
        if len(manifests) <= 1:
            return [self.create_object(m) for m in manifests]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="create")
        return list(self._pool.map(self.create_object, manifests))

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
