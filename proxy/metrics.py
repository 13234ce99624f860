"""Prometheus metrics, one registry per app (several proxies can live in one test process)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class CachedLabels:
    """A labelled metric whose children are looked up once: prometheus_client's `labels()` takes a
    lock and rebuilds the label tuple on every call, and the proxy calls it ~6 times per model call."""

    __slots__ = ("metric", "_children")

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


class ProxyMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.calls = Counter("tracefleet_proxy_calls", "Model calls by dialect and outcome", ["dialect", "status"], registry=r)
        self.prompt_tokens = Counter("tracefleet_proxy_prompt_tokens", "Prompt tokens sent to the engine", ["dialect"], registry=r)
        self.completion_tokens = Counter("tracefleet_proxy_completion_tokens", "Tokens sampled by the engine", ["dialect"], registry=r)
        self.ttft = Histogram("tracefleet_proxy_ttft_seconds", "Time from request received to first sampled token",
                              ["dialect"], buckets=_LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("tracefleet_proxy_latency_seconds", "Time from request received to last byte",
                                 ["dialect"], buckets=_LATENCY_BUCKETS, registry=r)
        self.errors = Counter("tracefleet_proxy_errors", "Failed calls by kind", ["kind"], registry=r)
        self.active_sessions = Gauge("tracefleet_proxy_active_sessions", "Open sessions", registry=r)
        self.paused = Gauge("tracefleet_proxy_paused", "1 while paused for a policy update", registry=r)
        self.policy_version = Gauge("tracefleet_proxy_policy_version", "Current policy version", registry=r)
        self.abandoned = Counter("tracefleet_proxy_abandoned_calls", "Calls cut off before their answer completed, by "
                                 "dialect and reason (client_disconnect, session_closed, proxy_shutdown)", ["dialect", "reason"], registry=r)
        self.engine_cancelled = Counter("tracefleet_proxy_engine_requests_cancelled",
                                        "Engine requests closed early because their call was abandoned", registry=r)
        self.session_in_flight = Gauge("tracefleet_proxy_session_in_flight_calls", "Calls in flight per open session",
                                       ["session"], registry=r)
        self.engine_timeouts = Counter("tracefleet_proxy_engine_timeouts", "Calls cut by an engine time limit, by the "
                                       "limit (connect, first_token, inter_token, total)", ["limit"], registry=r)
        self.drift = Counter("tracefleet_proxy_drift", "Calls whose prompt did not extend the served history", registry=r)

        for name in ("calls", "prompt_tokens", "completion_tokens", "ttft", "latency", "errors", "abandoned",
                     "engine_timeouts"):
            setattr(self, name, CachedLabels(getattr(self, name)))

    def render(self) -> bytes:
        return generate_latest(self.registry)
