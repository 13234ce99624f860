"""A cluster job's progress, where the dashboard runs beside the operator (`tracefleet dashboard URI --kubernetes`):
the RolloutJobs whose output is under the dashboard's URI, their status.counters as the JobProgress a local run
writes to its bucket (tracefleet.contract.progress). The operator never writes the bucket; its status is where a
cluster job's running count lives. Read with get/list on rolloutjobs only (the chart's dashboard Role)."""

from __future__ import annotations

import sys
from typing import Any

from tracefleet.contract.dashboard import job_path
from tracefleet.contract.job import GROUP, PLURAL, VERSION, RolloutJobStatus
from tracefleet.contract.progress import JobProgress


class RolloutJobProgress:
    """Called at each refresh: {dashboard path: progress} of the RolloutJobs under `uri` in `namespaces` (none:
    every namespace)."""

    def __init__(self, uri: str, namespaces: list[str]) -> None:
        from kubernetes import client

        from tracefleet.cluster_config import load_cluster_config

        load_cluster_config()
        self.api = client.CustomObjectsApi()
        self.uri = uri
        self.namespaces = namespaces
        self._said: set[str] = set()

    def _list(self) -> list[dict[str, Any]]:
        if not self.namespaces:
            return self.api.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=5)["items"]
        return [item for ns in self.namespaces
                for item in self.api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _request_timeout=5)["items"]]

    def __call__(self) -> dict[str, JobProgress]:
        try:
            items = self._list()
        except Exception as exc:  # noqa: BLE001 - the bucket's pages go on without it; said once per kind
            self._say(f"cannot list RolloutJobs: {exc}".splitlines()[0])
            return {}
        out = {}
        for item in items:
            name = item["metadata"]["name"]
            path = job_path(self.uri, ((item.get("spec") or {}).get("output") or {}).get("uri", ""), name)
            if path is None or not item.get("status"):
                continue
            try:
                out[path] = JobProgress.of_status(name, RolloutJobStatus.model_validate(item["status"]))
            except ValueError as exc:  # a newer operator's status: that job's page goes without it
                self._say(f"RolloutJob {name}: status unreadable: {exc}".splitlines()[0])
        return out

    def _say(self, line: str) -> None:
        if line not in self._said:
            self._said.add(line)
            print(f"dashboard: {line}", file=sys.stderr)
