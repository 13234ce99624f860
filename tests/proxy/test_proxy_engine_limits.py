"""The proxy's engine time limits, seen where a harness and a trainer see them: a streamed call that keeps
producing tokens for longer than its first-token and inter-token limits completes `ok` (there is no total cap
unless one is set); one whose engine goes quiet between tokens is cut at the inter-token limit, the harness told in
its dialect, the record saying which limit fired and keeping the tokens produced (true counts, the metrics with
them), the engine request closed. The same against real vLLM: tests/vllm/test_vllm_engine_limits.py."""

from __future__ import annotations

import time
from typing import Any

import httpx

from tracefleet.contract.capture import read_capture_log
from tracefleet.contract.engine_limits import EngineLimits

from fixtures.capture_counts import assert_counts_true, wait_for

LONG = " ".join(f"word{i}" for i in range(30))


def streamed_chat(proxy: Any, secret: str) -> str:
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", timeout=30,
                      json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
                      headers={"authorization": f"Bearer {secret}"}) as r:
        assert r.status_code == 200
        return r.read().decode()


def test_a_producing_call_outlives_its_limits_and_a_stalled_one_is_cut(scripted_engine: Any, start_proxy: Any) -> None:
    proxy = start_proxy(scripted_engine.url, engine_limits=EngineLimits(first_token_s=1.0, inter_token_s=0.5))
    s = proxy.new_session()
    scripted_engine.configure(token_delay_s=0.05, no_tools_text=LONG)  # ~60 tokens, 3 s: longer than 1 + 0.5 s
    started = time.monotonic()
    text = streamed_chat(proxy, s["secret"])
    assert time.monotonic() - started > 1.5 and "[DONE]" in text
    scripted_engine.configure(token_delay_s=0.8, first_token_delay_s=0.0)  # each token 0.8 s apart: a stall
    text = streamed_chat(proxy, s["secret"])
    assert "inter-token limit" in text and "interTokenSeconds" in text, text  # the harness's error event says which
    recs = read_capture_log(proxy.capture_dir / f"{s['session_id']}.jsonl").records
    assert [r.status for r in recs] == ["ok", "partial"] and recs[0].output_text == LONG
    cut = recs[1]
    assert cut.error is not None and (cut.error.kind, cut.error.limit, cut.error.status_code) == (
        "engine_timeout", "inter_token", 504)
    assert cut.completion_ids and len(cut.logprobs) == len(cut.completion_ids)  # what it produced is kept
    text = proxy.admin("GET", "/metrics").text
    assert_counts_true(recs, text)
    assert 'tracefleet_proxy_engine_timeouts_total{limit="inter_token"} 1.0' in text
    assert wait_for(lambda: scripted_engine.running() == 0, 5.0), "the engine request was not closed"
