"""Prometheus metrics of the operator, served on `--metrics-port` (the chart's metrics Service)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .status import PHASES

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


def record_job(namespace: str, job: str, phase: str, counters: dict[str, int]) -> None:
    for p in PHASES:
        JOBS_BY_PHASE.labels(namespace, job, p).set(1 if p == phase else 0)
    for s in _STATES:
        SESSIONS.labels(namespace, job, s).set(counters.get(s, 0))


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


def serve(port: int, addr: str = "0.0.0.0") -> None:
    start_http_server(port, addr=addr, registry=REGISTRY)
