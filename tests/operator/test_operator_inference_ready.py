"""InferenceReady (operator/inference_ready.py): from the managed Deployment as observed, or from a real
HTTP engine endpoint on loopback (reachable below 500, probed at most once per PROBE_TTL_S)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from fixtures.controlplane import free_port
from tracefleet.operator import status as st
from tracefleet.operator.inference_ready import EndpointProbe, deployment_condition


def test_deployment_condition() -> None:
    up = deployment_condition({"status": {"availableReplicas": 2}}, 3, False)
    assert (up.status, up.reason, up.message) == (st.TRUE, st.REASON_DEPLOYMENT_AVAILABLE, "2/3 replicas available")
    loading = deployment_condition({"status": {}}, 1, False)
    assert (loading.status, loading.reason) == (st.FALSE, st.REASON_DEPLOYMENT_UNAVAILABLE)
    suspended = deployment_condition({"status": {"availableReplicas": 1}}, 0, True)
    assert (suspended.status, suspended.reason) == (st.FALSE, st.REASON_SUSPENDED)
    assert up.type == loading.type == suspended.type == st.COND_INFERENCE_READY


class _Engine(http.server.BaseHTTPRequestHandler):
    code = 200
    hits = 0

    def do_GET(self) -> None:  # noqa: N802
        type(self).hits += 1
        self.send_response(type(self).code if self.path == "/v1/models" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _Engine.code, _Engine.hits = 200, 0
    yield f"http://127.0.0.1:{srv.server_address[1]}/"
    srv.shutdown()


def test_external_endpoint_reachability_is_probed_and_remembered(engine: str) -> None:
    probe = EndpointProbe()
    ok = probe.condition(engine)
    assert (ok.status, ok.reason, ok.message) == (st.TRUE, st.REASON_ENDPOINT_REACHABLE, "GET /v1/models -> 200")
    _Engine.code = 503
    assert probe.condition(engine) == ok and _Engine.hits == 1  # remembered: no second request
    down = EndpointProbe().condition(engine)
    assert (down.status, down.reason, down.message) == (st.FALSE, st.REASON_ENDPOINT_UNREACHABLE, "GET /v1/models -> 503")
    closed = EndpointProbe().condition(f"http://127.0.0.1:{free_port()}")
    assert closed.status == st.FALSE and closed.message.startswith("GET /v1/models failed: ")
