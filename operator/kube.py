"""The few Kubernetes API calls the reconcile makes, counted (metrics + the bench's requests/session)."""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from . import metrics
from . import names as n


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

    def _count(self, verb: str, kind: str) -> None:
        metrics.API_CALLS.labels(verb, kind).inc()
        with self._lock:
            self.calls += 1

    # ---- reads (raw JSON dicts: no model deserialisation cost at scale)

    def _json(self, fn: Any, *args: Any, **kw: Any) -> Any:
        resp = fn(*args, _preload_content=False, **kw)
        import json

        return json.loads(resp.data)

    def list_pods(self, ns: str, selector: str) -> list[dict[str, Any]]:
        self._count("list", "pods")
        return self._json(self.core.list_namespaced_pod, ns, label_selector=selector)["items"]

    def list_jobs(self, ns: str, selector: str) -> list[dict[str, Any]]:
        self._count("list", "jobs")
        return self._json(self.batch.list_namespaced_job, ns, label_selector=selector)["items"]

    def get_deployment(self, ns: str, name: str) -> dict[str, Any] | None:
        self._count("get", "deployments")
        try:
            return self._json(self.apps.read_namespaced_deployment, name, ns)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def get_configmap(self, ns: str, name: str) -> dict[str, Any] | None:
        self._count("get", "configmaps")
        try:
            return self._json(self.core.read_namespaced_config_map, name, ns)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def get_secret_data(self, ns: str, name: str) -> dict[str, str] | None:
        import base64

        self._count("get", "secrets")
        try:
            s = self._json(self.core.read_namespaced_secret, name, ns)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return {k: base64.b64decode(v).decode() for k, v in (s.get("data") or {}).items()}

    # ---- writes

    def create(self, manifest: dict[str, Any]) -> bool:
        """Create a child; False when it already exists (deterministic names make this the dedupe)."""
        kind = manifest["kind"]
        ns = manifest["metadata"]["namespace"]
        self._count("create", kind.lower())
        fn = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "Deployment": self.apps.create_namespaced_deployment,
            "Job": self.batch.create_namespaced_job,
            "NetworkPolicy": self.net.create_namespaced_network_policy,
        }[kind]
        try:
            fn(ns, manifest, _preload_content=False)
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    def create_many(self, manifests: list[dict[str, Any]], workers: int = 16) -> list[bool]:
        """Creates in parallel (bounded pool): at parallelism 500 one-by-one creates dominate start-up time."""
        if len(manifests) <= 1:
            return [self.create(m) for m in manifests]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(workers, len(manifests))) as pool:
            return list(pool.map(self.create, manifests))

    def delete_pod(self, ns: str, name: str) -> None:
        self._count("delete", "pods")
        try:
            self.core.delete_namespaced_pod(name, ns, grace_period_seconds=30, _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                raise

    def scale_deployment(self, ns: str, name: str, replicas: int) -> None:
        self._count("patch", "deployments")
        self.apps.patch_namespaced_deployment(name, ns, {"spec": {"replicas": replicas}}, _preload_content=False)

    def annotate_job(self, ns: str, name: str, annotations: dict[str, str]) -> None:
        self._count("patch", "jobs")
        self.batch.patch_namespaced_job(name, ns, {"metadata": {"annotations": annotations}}, _preload_content=False)

    def delete_rolloutjob(self, ns: str, name: str) -> None:
        self._count("delete", "rolloutjobs")
        try:
            self.custom.delete_namespaced_custom_object(
                n.GROUP, n.VERSION, ns, n.PLURAL, name, propagation_policy="Background", _preload_content=False
            )
        except ApiException as e:
            if e.status != 404:
                raise
