"""Real vLLM: a call the harness abandons mid-generation is recorded by the proxy within a second, with the true
token counts of what it holds (the proxy's token metrics agreeing), and aborted at vLLM (closing the proxy's
engine connection is what makes vLLM abort it), streamed or not: `vllm:num_requests_running` goes back to where
it was and vLLM's generated-token counter stops short of the call's cap.

The client hangs up once that counter has risen since its call was sent, not on the running gauge: a counter
cannot be left over from an earlier test, so the hang-up always falls while vLLM is generating this call."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tracefleet.contract.capture import read_capture_log
from tracefleet.proxy.app import create_app
from tracefleet.proxy.config import ProxyConfig

from fixtures.abandoning_client import abandon, request_bytes
from fixtures.capture_counts import assert_counts_true
from fixtures.proxy_on_vllm import RUNS_TO_CAP, RUNS_TO_CAP_TOKENS
from fixtures.servers import ServedApp, serve_in_thread

ADMIN = "admin-token-for-vllm-tests"
HOLD_S = 5.0  # the most the client waits for vLLM to generate for the call before it hangs up anyway
GENERATED = "vllm:generation_tokens_total"


@pytest.fixture
def proxy(vllm_server: Any, tmp_path: Path) -> Iterator[ServedApp]:
    served = serve_in_thread(create_app(ProxyConfig(engine_url=vllm_server.url, capture_dir=tmp_path, admin_token=ADMIN)))
    try:
        yield served
    finally:
        served.stop()


def running(vllm_server: Any) -> int:
    return int(vllm_server.counter("vllm:num_requests_running"))


def settled_running(vllm_server: Any, wait_s: float = 30.0) -> int:
    """Requests vLLM is running once an earlier test's calls are gone (or after `wait_s`, longer than a call
    left running takes to reach the 512-token cap: 13 s measured here): the generated-token counter the test
    reads is then this call's alone."""
    deadline = time.monotonic() + wait_s
    while (now := running(vllm_server)) > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    return now


@pytest.mark.parametrize(("dialect", "stream"), [("openai-chat", False), ("openai-chat", True), ("anthropic", False),
                                                 ("google", True)])
def test_abandoned_call_is_aborted_at_vllm(vllm_server: Any, proxy: ServedApp, tmp_path: Path, dialect: str,
                                           stream: bool) -> None:
    session = httpx.post(proxy.url + "/admin/sessions", json={}, headers={"authorization": f"Bearer {ADMIN}"},
                         timeout=30).json()
    url = urlsplit(proxy.url)
    before = settled_running(vllm_server)
    start = vllm_server.counter(GENERATED)
    generating: list[float] = []  # when the client saw vLLM generating (empty: never, within HOLD_S)

    def ready() -> bool:
        if vllm_server.counter(GENERATED) > start:
            generating.append(time.time())
        return bool(generating)

    sent = time.time()
    hung_up = abandon(url.hostname, url.port, request_bytes(dialect, stream, session["secret"], prompt=RUNS_TO_CAP, greedy=True), stream,
                      hold_s=HOLD_S, ready=ready)
    log = tmp_path / f"{session['session_id']}.jsonl"
    while not (log.exists() and read_capture_log(log).records) and time.time() < hung_up + 1.0:
        time.sleep(0.02)
    recs = read_capture_log(log).records if log.exists() else []
    seen = f"{generating[0] - sent:.2f} s after sending" if generating else f"not within {HOLD_S} s"
    assert [r.error.kind if r.error else r.status for r in recs] == ["client_disconnect"], (
        f"vLLM generating: {seen}; hung up {hung_up - sent:.2f} s after sending; running before: {before}; "
        + "; ".join(f"{r.status} {r.finish_reason} {r.completion_tokens} tokens" for r in recs))
    assert recs[0].timings.done_at - hung_up < 1.0
    # its counts are those of the ids it holds (a streamed one's tokens so far), and the proxy's metrics agree
    assert_counts_true(recs, httpx.get(proxy.url + "/metrics", timeout=10).text)
    deadline = time.monotonic() + 5
    while running(vllm_server) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(vllm_server) <= before, "vLLM is still generating for the abandoned call"
    stopped = vllm_server.counter(GENERATED)
    time.sleep(0.5)
    assert vllm_server.counter(GENERATED) == stopped < start + RUNS_TO_CAP_TOKENS, (start, stopped)
