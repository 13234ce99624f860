"""Exact-mode metrics on the proxy's Prometheus registry: splice hit ratio, new roots by reason, parse failures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry


class ExactCollector(Collector):
    def __init__(self, engine: Any) -> None:
        self.engine = engine  # ExactTokenEngine: its counters are read at scrape time

    def collect(self) -> Iterator[Any]:
        st = self.engine.stats
        calls = CounterMetricFamily("tracefleet_proxy_exact_calls", "Exact-mode calls by how the prompt was built",
                                    labels=["kind"])
        for kind in ("spliced", "new_roots", "retries"):
            calls.add_metric([{"spliced": "spliced", "new_roots": "new_root", "retries": "retry"}[kind]], st[kind])
        yield calls
        roots = CounterMetricFamily("tracefleet_proxy_exact_new_roots", "Calls that started a new root, by reason",
                                    labels=["reason"])
        for reason, n in sorted(self.engine.new_root_reasons.items()):
            roots.add_metric([reason], n)
        yield roots
        tokens = CounterMetricFamily("tracefleet_proxy_exact_prompt_tokens", "Prompt tokens by origin", labels=["origin"])
        tokens.add_metric(["reused"], st["reused_tokens"])
        tokens.add_metric(["rendered"], st["rendered_tokens"])
        yield tokens
        total = st["reused_tokens"] + st["rendered_tokens"]
        yield GaugeMetricFamily("tracefleet_proxy_exact_splice_hit_ratio",
                                "Share of prompt tokens taken verbatim from served ids",
                                value=st["reused_tokens"] / total if total else 0.0)
        yield CounterMetricFamily("tracefleet_proxy_exact_parse_failures",
                                  "Calls with a tool call that did not parse (returned as text, flagged)",
                                  value=st["parse_failures"])


def register_exact_metrics(registry: CollectorRegistry, engine: Any) -> None:
    registry.register(ExactCollector(engine))
