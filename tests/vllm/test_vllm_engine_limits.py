"""Against real vLLM: the proxy's engine time limits, and the kind of logprobs every record says it holds.

- A streamed call that produces tokens for longer than its first-token and inter-token limits together completes
  `ok` (no total cap unless one is set).
- A call whose engine stalls between tokens (vLLM `/pause?mode=keep` freezes it mid-generation; the session's
  server runs with VLLM_SERVER_DEV_MODE=1) is cut at the inter-token limit: the harness gets its dialect's error
  naming the limit, the record says `engine_timeout` / `inter_token` and keeps the tokens produced with their true
  counts, the proxy's token metrics agree, and the engine request is closed (vLLM runs nothing once resumed).
- Records from a vLLM started with processed logprobs (tracefleet's arguments) and from one started with vLLM's
  default raw logprobs say which they carry, taken from the arguments each was started with as the operator does
  for a managed engine (vLLM's /v1/models does not say); what they say is true (the raw ones equal a re-score,
  the processed ones do not at T=0.5), and the trainer reader refuses the raw ones unless told.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tracefleet.bucket import open_bucket
from tracefleet.contract.engine_limits import EngineLimits
from tracefleet.engine.vllm_local import VllmFailed, VllmMissing, launch
from tracefleet.traces import BatchReader, RawLogprobs, Sealer, SessionInfo, build_traces
from tracefleet.contract.engine_limits import logprobs_mode_of

from fixtures.capture_counts import assert_counts_true, wait_for
from fixtures.proxy_on_vllm import ADMIN, SESSION, auth_headers, dialect_request, post, start_proxy_on_vllm
from fixtures.vllm import OUTPUT_CAP_ARGS

ESSAY = "Write a 3000-word essay on the history of Rome."  # greedy SmolLM2 writes to the 512-token cap
# shorter than a 512-token answer takes (14 s at SmolLM2's best here, 70 s on loaded cores), long enough that a
# machine shared with other work (load 13 on 2 cores, measured) does not cut it
LIMITS = EngineLimits(first_token_s=10.0, inter_token_s=3.0)


def running(vllm: Any) -> int:
    return int(vllm.counter("vllm:num_requests_running"))


def vllm_route(vllm: Any, route: str) -> None:
    httpx.post(vllm.url + route, timeout=30).raise_for_status()


def stream(proxy: Any, vllm: Any, lines: list[str], max_tokens: int = 512) -> None:
    path, body = dialect_request("chat", vllm.model, ESSAY, max_tokens, stream=True)
    with httpx.stream("POST", proxy.url + path, json=body, headers=auth_headers("chat"), timeout=300) as r:
        lines.extend(r.iter_lines())


def test_a_producing_stream_completes_and_a_stalled_engine_is_cut_at_the_inter_token_limit(
        vllm_server: Any, tmp_path: Path) -> None:
    proxy = start_proxy_on_vllm(vllm_server, tmp_path / "capture", "exact", engine_limits=LIMITS)
    try:
        # vLLM's first request after start-up is slow (seconds): not what the first-token limit is about here
        httpx.post(vllm_server.url + "/v1/completions", json={"model": vllm_server.model, "prompt": "Hi",
                                                             "max_tokens": 1}, timeout=120).raise_for_status()
        lines: list[str] = []
        started = time.monotonic()
        stream(proxy, vllm_server, lines)
        elapsed = time.monotonic() - started
        print(f"uncut stream: {elapsed:.1f} s")
        assert [ln for ln in lines if ln][-1] == "data: [DONE]"
        [ok] = proxy.records()
        assert ok.status == "ok" and ok.error is None and len(ok.completion_ids) == 512
        assert elapsed > max(LIMITS.first_token_s, LIMITS.inter_token_s)  # produced for longer than either limit
        assert ok.logprobs_mode == "processed_logprobs"

        before = running(vllm_server)
        lines = []
        caller = threading.Thread(target=stream, args=(proxy, vllm_server, lines))
        caller.start()
        assert wait_for(lambda: any('"content":"' in ln and '"content":""' not in ln for ln in lines), 120)
        paused = time.monotonic()
        vllm_route(vllm_server, "/pause?mode=keep")  # the generation freezes mid-stream
        try:
            caller.join(30)
            cut_s = time.monotonic() - paused
        finally:
            vllm_route(vllm_server, "/resume")
        print(f"cut {cut_s:.1f} s after the pause")
        assert not caller.is_alive() and LIMITS.inter_token_s <= cut_s < LIMITS.inter_token_s + 5
        last = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: ") and ln != "data: [DONE]"][-1]
        assert last["error"]["code"] == "engine_timeout" and "inter-token limit" in last["error"]["message"], last
        cut = proxy.records()[-1]
        assert (cut.status, cut.error.kind, cut.error.limit) == ("partial", "engine_timeout", "inter_token"), cut.error
        assert cut.completion_ids and len(cut.logprobs) == len(cut.completion_ids) and cut.output_text
        text = httpx.get(proxy.url + "/metrics", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10).text
        assert_counts_true(proxy.records(), text)
        assert wait_for(lambda: running(vllm_server) <= before, 10), "vLLM still generates for the cut call"
    finally:
        proxy.stop()


def seal_one(capture: Path, bucket: Path, job: str) -> Any:
    traces = build_traces(capture / f"{SESSION}.jsonl", session=SessionInfo(job=job, group_id="g", reward=1.0)).traces
    Sealer(open_bucket(str(bucket)), job, spool=bucket.parent / f"spool-{job}").seal(traces)
    return BatchReader(str(bucket), job).read(0)


def test_records_say_whether_vllm_reports_processed_or_raw_logprobs(vllm_server: Any, tmp_path: Path) -> None:
    raw_args = [*OUTPUT_CAP_ARGS, "--logprobs-mode", "raw_logprobs"]  # as an external vLLM often runs: its default
    try:
        raw_vllm = launch(log=tmp_path / "vllm-raw.log", extra_args=raw_args)
    except (VllmMissing, VllmFailed) as exc:
        pytest.fail(str(exc), pytrace=False)
    batches = {}
    try:
        for name, vllm, args in (("processed", vllm_server, OUTPUT_CAP_ARGS), ("raw", raw_vllm, raw_args)):
            proxy = start_proxy_on_vllm(vllm, tmp_path / f"capture-{name}", "exact",
                                        logprobs_mode=logprobs_mode_of(args))  # as the operator tells its sidecars
            try:
                path, body = dialect_request("chat", vllm.model, "Say hello.", 8, temperature=0.5, seed=1)
                assert post(proxy, "chat", path, body).status_code == 200
                [rec] = proxy.records()
            finally:
                proxy.stop()
            assert rec.logprobs_mode == f"{name}_logprobs"
            assert rec.sampling["temperature"] == {"value": 0.5, "source": "request"}
            # what the label says is true: raw logprobs are the unscaled distribution's (a re-score's)
            scored = httpx.post(vllm.url + "/v1/completions", timeout=60, json={
                "model": vllm.model, "prompt": rec.prompt_ids + rec.completion_ids, "max_tokens": 1,
                "prompt_logprobs": 0}).raise_for_status().json()["choices"][0]["prompt_logprobs"][len(rec.prompt_ids):]
            unscaled = [s[str(t)]["logprob"] for s, t in zip(scored, rec.completion_ids, strict=True)]
            gap = max(abs(a - b) for a, b in zip(rec.logprobs, unscaled, strict=True))
            assert (gap < 1e-3) == (name == "raw"), (name, gap)
            batches[name] = seal_one(tmp_path / f"capture-{name}", tmp_path / "bucket", f"job-{name}")
    finally:
        raw_vllm.stop()
    spans = {name: [s["logprobs_mode"] for s in b.table.column("spans").to_pylist()[0]] for name, b in batches.items()}
    assert spans == {"processed": ["processed_logprobs"], "raw": ["raw_logprobs"]}
    assert batches["processed"].tensors()["old_logprobs"].shape[0] == 1
    with pytest.raises(RawLogprobs, match="raw logprobs"):
        batches["raw"].tensors()
    olp = batches["raw"].tensors(allow_raw_logprobs=True)["old_logprobs"]
    assert math.isfinite(float(olp.sum()))
