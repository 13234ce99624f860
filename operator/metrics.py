"""Prometheus metrics of the operator, served on `--metrics-port` (the chart's metrics Service)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tracefleet.contract.job import Counters
from tracefleet.contract.semantics import DiagnosticsCounts
from tracefleet.operator.status import PHASES

# What the diagnostics made of a job's sealed sessions (tracefleet.contract.semantics.DiagnosticsCounts), by
# name for dashboards and alerts; Prometheus adds `_total` to the counters' names.
SESSIONS_JUDGED = "tracefleet_sessions_judged"  # {namespace, job}
SESSIONS_QUARANTINED = "tracefleet_sessions_quarantined"  # {namespace, job, diagnostic}
SESSIONS_DROPPED = "tracefleet_sessions_dropped"  # {namespace, job, diagnostic}
QUARANTINE_RATE = "tracefleet_quarantine_rate"  # {namespace, job}

REGISTRY = CollectorRegistry()

JOBS_BY_PHASE = Gauge(
    "tracefleet_rolloutjobs", "RolloutJobs by phase", ["namespace", "job", "phase"], registry=REGISTRY
)
SESSIONS = Gauge(
    "tracefleet_sessions", "Sessions of a RolloutJob by state", ["namespace", "job", "state"], registry=REGISTRY
)
RECONCILE_SECONDS = Histogram(
    "tracefleet_reconcile_seconds",
    "Time of one level-based reconcile of a RolloutJob",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "tracefleet_reconcile_errors_total", "Reconciles that raised", ["reason"], registry=REGISTRY
)
API_CALLS = Counter(
    "tracefleet_api_calls_total", "Kubernetes API calls made by reconciles", ["verb", "kind"], registry=REGISTRY
)
CHILDREN_CREATED = Counter(
    "tracefleet_children_created_total", "Child objects created", ["component"], registry=REGISTRY
)
BATCHES_SEALED = Counter(
    "tracefleet_batches_sealed_total", "Batches seen sealed (counted once per operator process)", registry=REGISTRY
)
WEBHOOKS = Counter(
    "tracefleet_webhook_deliveries_total", "Trainer webhook deliveries", ["outcome"], registry=REGISTRY
)

_STATES = ("pending", "running", "succeeded", "failed")


class DiagnosticsCollector:
    """The diagnostics' counts per job as counters whose values are the job's totals over its recorded
    batches (state in the cluster, not in this process): after an operator restart the first reconcile
    shows the same totals, and a batch is never counted twice."""

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], DiagnosticsCounts] = {}
        self._lock = threading.Lock()

    def set(self, namespace: str, job: str, counts: DiagnosticsCounts) -> None:
        with self._lock:
            self._jobs[(namespace, job)] = counts

    def forget(self, namespace: str, job: str) -> None:
        with self._lock:
            self._jobs.pop((namespace, job), None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            jobs = sorted(self._jobs.items())
        judged = CounterMetricFamily(SESSIONS_JUDGED, "Sessions of a RolloutJob sealed, each judged by its diagnostics",
                                     labels=["namespace", "job"])
        quarantined = CounterMetricFamily(
            SESSIONS_QUARANTINED, "Sealed sessions quarantined or dropped (left out of training) with a finding of "
            "`diagnostic`; a session with findings of two diagnostics counts for both", labels=["namespace", "job", "diagnostic"])
        dropped = CounterMetricFamily(SESSIONS_DROPPED, "Sealed sessions whose token rows were dropped, with a finding of "
                                      "`diagnostic`", labels=["namespace", "job", "diagnostic"])
        rate = GaugeMetricFamily(QUARANTINE_RATE, "Quarantined / judged sessions of a RolloutJob (spec.diagnosticsPolicy "
                                 "compares it with maxQuarantineRate)", labels=["namespace", "job"])
        for (ns, job), c in jobs:
            judged.add_metric([ns, job], c.judged)
            rate.add_metric([ns, job], c.rate)
            for name, value in c.quarantined_by.items():
                quarantined.add_metric([ns, job, name], value)
            for name, value in c.dropped_by.items():
                dropped.add_metric([ns, job, name], value)
        yield from (judged, quarantined, dropped, rate)


DIAGNOSTICS = DiagnosticsCollector()
REGISTRY.register(DIAGNOSTICS)


def record_job(namespace: str, job: str, phase: str, counters: Counters,
               diagnostics: DiagnosticsCounts | None = None) -> None:
    for p in PHASES:
        JOBS_BY_PHASE.labels(namespace, job, p).set(1 if p == phase else 0)
    for s in _STATES:
        SESSIONS.labels(namespace, job, s).set(getattr(counters, s))
    if diagnostics is not None:
        DIAGNOSTICS.set(namespace, job, diagnostics)


def forget_job(namespace: str, job: str) -> None:
    for p in PHASES:
        try:
            JOBS_BY_PHASE.remove(namespace, job, p)
        except KeyError:
            pass
    for s in _STATES:
        try:
            SESSIONS.remove(namespace, job, s)
        except KeyError:
            pass
    DIAGNOSTICS.forget(namespace, job)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    start_http_server(port, addr=addr, registry=REGISTRY)
