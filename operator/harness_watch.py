"""The harness pods of every job, kept by one list + watch per namespace instead of a list per reconcile.

Why: at 10,000 sessions a label-selected list returns every pod the job ever had (tens of MB of JSON per
pass, parsed in the operator on every pass); a watch delivers each change once. Only what the session
table reads is kept, and it is compact for finished pods: a live pod is a small dict (bounded by
spec.parallelism), a succeeded session is one bit, a failed pod a few fields (failures are few). So the
operator's memory does not grow with finished sessions.

Consistency: a reconcile waits until its namespace's first list is in (`view` raises kopf.TemporaryError
after SYNC_TIMEOUT_S). A pod this operator just created is entered at once (`created`), unless the watch has
already delivered a later resourceVersion - so the next pass does not create it again before its watch
event arrives. A lost watch (410 Gone, a dropped connection) is relisted from scratch.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import kopf

from tracefleet.operator import names as n
from tracefleet.operator.kube import Kube
from tracefleet.operator.session_table import pod_finished_at

log = logging.getLogger(__name__)

# The pods this operator made as harness pods, in any job (one watch per namespace serves every job in it).
HARNESS_SELECTOR = f"{n.LABEL_MANAGED_BY}={n.MANAGED_BY},{n.LABEL_COMPONENT}={n.COMPONENT_HARNESS}"
SYNC_TIMEOUT_S = 30.0
# The API server ends a watch after this long; the next one resumes from the last resourceVersion.
WATCH_TIMEOUT_S = 300
RETRY_S = 1.0


class SessionBits:
    """A set of session indices as one bit each."""

    def __init__(self) -> None:
        self._bits = bytearray()

    def add(self, s: int) -> None:
        if s >= len(self._bits) * 8:
            self._bits.extend(bytes(s // 8 + 1 - len(self._bits)))
        self._bits[s // 8] |= 1 << (s % 8)

    def discard(self, s: int) -> None:
        if s < len(self._bits) * 8:
            self._bits[s // 8] &= ~(1 << (s % 8)) & 0xFF

    def __iter__(self):
        for i, byte in enumerate(self._bits):
            if byte:
                for b in range(8):
                    if byte >> b & 1:
                        yield i * 8 + b


def _slim(pod: dict[str, Any]) -> dict[str, Any]:
    """What the session table reads of a live pod."""
    meta = pod["metadata"]
    keep = {k: meta[k] for k in ("name", "labels", "deletionTimestamp", "creationTimestamp") if k in meta}
    return {"metadata": keep, "status": {"phase": (pod.get("status") or {}).get("phase")}}


def _failed(pod: dict[str, Any]) -> dict[str, Any]:
    """A failed pod as the session table reads it (its finish time is all backoff needs)."""
    slim = _slim(pod)
    slim["status"]["conditions"] = [{"lastTransitionTime": _iso(pod_finished_at(pod))}]
    return slim


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _session(pod: dict[str, Any]) -> tuple[str, int] | None:
    labels = pod["metadata"].get("labels") or {}
    try:
        return labels[n.LABEL_JOB], int(labels[n.LABEL_SESSION])
    except (KeyError, ValueError):
        return None


def _rv(value: str | None) -> int | None:
    try:
        return int(value or "")
    except ValueError:
        return None  # resourceVersions are opaque: without a number, created pods wait for their event


@dataclass
class JobPods:
    live: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> slim pod (Pending/Running/unknown)
    failed: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> slim failed pod
    succeeded: SessionBits = field(default_factory=SessionBits)


@dataclass
class HarnessView:
    """The harness pods of one job: live and failed ones as pods, succeeded ones as session indices."""

    pods: list[dict[str, Any]]
    succeeded: list[int]


def apply_event(jobs: dict[str, JobPods], pod: dict[str, Any], deleted: bool) -> None:
    """One watch event (or listed pod) into the per-job state."""
    key = _session(pod)
    if key is None or (deleted and key[0] not in jobs):
        return  # (a deleted job's pods going away do not bring its entry back)
    jp = jobs.setdefault(key[0], JobPods())
    name = pod["metadata"]["name"]
    phase = (pod.get("status") or {}).get("phase")
    jp.live.pop(name, None)
    jp.failed.pop(name, None)
    if phase == "Succeeded":
        # a finished pod cannot change phase: its bit goes only when the pod itself goes
        (jp.succeeded.discard if deleted else jp.succeeded.add)(key[1])
    elif deleted:
        pass
    elif phase == "Failed":
        jp.failed[name] = _failed(pod)
    else:
        jp.live[name] = _slim(pod)


class _Namespace:
    def __init__(self, kube: Kube, ns: str) -> None:
        self.kube, self.ns = kube, ns
        self.jobs: dict[str, JobPods] = {}
        self.rv: int | None = None
        self.synced = threading.Event()
        self.lock = threading.Lock()
        threading.Thread(target=self._run, name=f"harness-watch-{ns}", daemon=True).start()

    def _relist(self) -> str:
        resp = self.kube.list_pods_raw(self.ns, HARNESS_SELECTOR)
        jobs: dict[str, JobPods] = {}
        for pod in resp["items"]:
            apply_event(jobs, pod, False)
        rv = resp["metadata"].get("resourceVersion", "")
        with self.lock:
            self.jobs, self.rv = jobs, _rv(rv)
        self.synced.set()
        return rv

    def _run(self) -> None:
        rv = ""
        while True:
            try:
                if not rv:
                    rv = self._relist()
                for ev in self.kube.watch_pods(self.ns, HARNESS_SELECTOR, rv, WATCH_TIMEOUT_S):
                    obj = ev.get("object") or {}
                    if ev.get("type") == "ERROR":
                        log.info("harness pod watch in %s: %s; relisting", self.ns, obj.get("message"))
                        rv = ""
                        break
                    rv = obj.get("metadata", {}).get("resourceVersion") or rv
                    if ev.get("type") == "BOOKMARK":
                        continue
                    with self.lock:
                        apply_event(self.jobs, obj, ev.get("type") == "DELETED")
                        self.rv = _rv(rv)
            except Exception as e:  # noqa: BLE001 - any failure: relist after a pause, the reconcile waits meanwhile
                log.warning("harness pod watch in %s failed: %s; relisting", self.ns, e)
                rv = ""
                time.sleep(RETRY_S)

    def view(self, job: str) -> HarnessView:
        with self.lock:
            jp = self.jobs.get(job) or JobPods()
            return HarnessView(pods=[*jp.live.values(), *jp.failed.values()], succeeded=list(jp.succeeded))

    def created(self, pod: dict[str, Any]) -> None:
        rv = _rv(pod["metadata"].get("resourceVersion"))
        with self.lock:
            if rv is None or self.rv is None or rv <= self.rv:
                return  # the watch has it (or will say it better)
            key = _session(pod)
            if key is not None:
                self.jobs.setdefault(key[0], JobPods()).live.setdefault(pod["metadata"]["name"], _slim(pod))

    def forget(self, job: str) -> None:
        with self.lock:
            self.jobs.pop(job, None)


class HarnessWatch:
    """One `_Namespace` watch per namespace that has a job, started by the first reconcile there."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._ns: dict[str, _Namespace] = {}
        self._lock = threading.Lock()

    def _of(self, ns: str) -> _Namespace:
        with self._lock:
            if ns not in self._ns:
                self._ns[ns] = _Namespace(self.kube, ns)
            return self._ns[ns]

    def view(self, ns: str, job: str) -> HarnessView:
        w = self._of(ns)
        if not w.synced.wait(SYNC_TIMEOUT_S):
            raise kopf.TemporaryError(f"harness pods of {ns} not listed yet", delay=RETRY_S)
        return w.view(job)

    def created(self, pod: dict[str, Any]) -> None:
        self._of(pod["metadata"]["namespace"]).created(pod)

    def forget(self, ns: str, job: str) -> None:
        with self._lock:
            w = self._ns.get(ns)
        if w is not None:
            w.forget(job)
