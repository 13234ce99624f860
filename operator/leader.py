"""Leader election on a coordination.k8s.io Lease: of the operator's replicas exactly one reconciles.

Why a Lease and not kopf peering. kopf's peering is presence, not a lock: each operator writes itself
into a KopfPeering object and pauses while it sees a peer of higher priority; replicas of one Deployment
share a priority, and kopf then only warns about "possibly conflicting operators" - and a new replica
handles events until its first peering read. It also needs its own cluster-scoped CRD. A Lease is the
Kubernetes way (client-go's leaderelection, as kube-controller-manager and kube-scheduler run it): it is
written with optimistic concurrency (resourceVersion), so two candidates never both acquire it; the
holder renews it every `retry_s` and stops acting - this process exits - when it could not renew for
`renew_deadline_s`, which is shorter than `lease_duration_s`, the time the others must see the Lease
unchanged before they take it. So at most one replica runs kopf's handlers at any moment.

Takeover: the standby polls every `retry_s`; after the leader dies (SIGKILL, node loss) it takes the Lease
once it has seen it unchanged for `lease_duration_s`, so within lease_duration_s + retry_s (17 s with the
defaults below), then starts kopf, whose first reconcile runs at once. A leader that stops cleanly
(SIGTERM, a rolling update) releases the Lease and the standby takes over within retry_s. Nothing is
handed over: every reconcile is level-based from the cluster (children, their annotations, the job's
status), children have deterministic names (a repeated create is a 409), and Events have deterministic
names too (tracefleet.operator.events), so a pass the dead leader left half done is simply redone.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException

from tracefleet.operator.kube import Kube

log = logging.getLogger(__name__)

LEASE_NAME = "tracefleet-operator"
# client-go's defaults (kube-controller-manager's too).
LEASE_DURATION_S = 15.0
RENEW_DEADLINE_S = 10.0
RETRY_S = 2.0
# Exit status of a leader that lost its Lease: the Deployment restarts it as a standby.
EXIT_LEASE_LOST = 3


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def _micro_time(ts: float | None = None) -> str:
    return datetime.fromtimestamp(ts if ts is not None else time.time(), timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    def __init__(self, kube: Kube, namespace: str, identity: str, name: str = LEASE_NAME,
                 lease_duration_s: float = LEASE_DURATION_S, renew_deadline_s: float = RENEW_DEADLINE_S,
                 retry_s: float = RETRY_S) -> None:
        if not retry_s < renew_deadline_s < lease_duration_s:
            raise ValueError("lease timings need retry < renew deadline < lease duration")
        self.kube, self.ns, self.name, self.identity = kube, namespace, name, identity
        self.lease_duration_s, self.renew_deadline_s, self.retry_s = lease_duration_s, renew_deadline_s, retry_s
        self.api = client.CoordinationV1Api(kube.api_client)
        self._observed: Any = None  # the Lease spec last seen, and when (our clock: no skew between nodes)
        self._observed_at = 0.0
        self._last_renew = 0.0
        self._held: dict[str, Any] | None = None  # the Lease as we last wrote it (its resourceVersion)
        self._stop = threading.Event()
        self.leading = threading.Event()

    # ---- one attempt

    def _call(self, verb: str, fn: Any, *args: Any, **kw: Any) -> Any:
        return self.kube.json_or_conflict(verb, "leases", f"{self.ns}/{self.name}", fn, *args,
                                        _request_timeout=max(1.0, self.retry_s), **kw)

    def try_acquire_or_renew(self) -> bool:
        try:
            return self._try_acquire_or_renew()
        except (kopf.TemporaryError, kopf.PermanentError) as e:
            log.warning("the Lease %s/%s: %s", self.ns, self.name, e)
            return False

    def _try_acquire_or_renew(self) -> bool:
        if self._held is not None and self._renew(self._held):
            return True  # renewed from the Lease as we last wrote it: one request, not a read and a write
        self._held = None
        now = time.time()
        lease = self._call("get", self.api.read_namespaced_lease, self.name, self.ns)
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": int(round(self.lease_duration_s)),
                "acquireTime": _micro_time(now), "renewTime": _micro_time(now), "leaseTransitions": 0}
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.ns}, "spec": spec}
            return self._won(self._call("create", self.api.create_namespaced_lease, self.ns, body))
        if isinstance(lease, ApiException):
            return False
        old = lease.get("spec") or {}
        if old != self._observed:
            self._observed, self._observed_at = old, time.monotonic()
        holder = old.get("holderIdentity")
        if holder and holder != self.identity and time.monotonic() < self._observed_at + self.lease_duration_s:
            return False  # held, and renewed within a lease duration as far as we have seen
        if holder == self.identity:
            spec["acquireTime"] = old.get("acquireTime") or spec["acquireTime"]
            spec["leaseTransitions"] = old.get("leaseTransitions") or 0
        else:
            spec["leaseTransitions"] = (old.get("leaseTransitions") or 0) + 1
        lease["spec"] = spec
        return self._won(self._call("replace", self.api.replace_namespaced_lease, self.name, self.ns, lease))

    def _renew(self, lease: dict[str, Any]) -> bool:
        """Replace the Lease we hold with a new renewTime; False on a 409 (someone wrote it since: read it again)."""
        lease = {**lease, "spec": {**lease["spec"], "renewTime": _micro_time()}}
        return self._won(self._call("replace", self.api.replace_namespaced_lease, self.name, self.ns, lease))

    def _won(self, written: Any) -> bool:
        if written is None or isinstance(written, ApiException):
            return False  # someone else wrote it first (409) or the API server did not answer
        self._held = written
        self._observed, self._observed_at = written["spec"], time.monotonic()
        self._last_renew = time.monotonic()
        return True

    # ---- the loops

    def wait_until_leading(self) -> None:
        """Blocks until this process holds the Lease."""
        logged = False
        while not self.try_acquire_or_renew():
            if not logged:
                log.info("standby: the Lease %s/%s is held by %s", self.ns, self.name,
                         (self._observed or {}).get("holderIdentity"))
                logged = True
            time.sleep(self.retry_s)
        log.warning("leading: %s holds the Lease %s/%s", self.identity, self.ns, self.name)
        self.leading.set()

    def keep_leading(self, on_lost: Callable[[], None]) -> threading.Thread:
        """Renews the Lease in a thread; `on_lost()` once it could not for renew_deadline_s or saw another holder."""

        def loop() -> None:
            while not self._stop.wait(self.retry_s):
                try:
                    self.try_acquire_or_renew()
                except Exception as e:  # noqa: BLE001 - a failed renewal is retried until the deadline
                    log.warning("renewing the Lease failed: %s", e)
                holder = (self._observed or {}).get("holderIdentity")
                taken = holder is not None and holder != self.identity
                if (taken or time.monotonic() - self._last_renew > self.renew_deadline_s) and not self._stop.is_set():
                    log.error("lost the Lease %s/%s (%s): stopping", self.ns, self.name,
                              f"{holder} holds it" if taken else f"not renewed for {self.renew_deadline_s:g} s")
                    self.leading.clear()
                    on_lost()
                    return

        t = threading.Thread(target=loop, name="lease-renew", daemon=True)
        t.start()
        return t

    def release(self) -> None:
        """Give the Lease up (a clean stop): the standby takes it at its next try, not a lease duration later."""
        self._stop.set()
        if not self.leading.is_set():
            return
        self.leading.clear()
        self._held = None
        try:
            lease = self._call("get", self.api.read_namespaced_lease, self.name, self.ns)
            if isinstance(lease, dict) and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"].update({"holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": _micro_time()})
                self._call("replace", self.api.replace_namespaced_lease, self.name, self.ns, lease)
        except Exception as e:  # noqa: BLE001 - the others then wait out the lease duration
            log.warning("releasing the Lease failed: %s", e)
