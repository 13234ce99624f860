"""Against real vLLM (the session's `vllm_server`, which runs with VLLM_SERVER_DEV_MODE=1): a trainer's weight
sync through the proxy, and the calls vLLM aborts on the way.

The flow is the one a trainer runs: proxy pause -> vLLM `/pause?mode=abort` (in-flight generations end with
finish_reason "abort") -> new weights (`/collective_rpc` `reload_weights` from a checkpoint directory, the
route that works on the CPU build) -> policy version set on the proxy and on vLLM -> vLLM `/resume` -> proxy
resume. Calls cut by the pause are reported to the harness as retryable errors and never recorded (or
spliced) as finished turns; calls admitted afterwards carry the new policy version and, the weights having
changed, other logprobs for the same prompt. The weights are put back at the end: the server is shared.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tracefleet.proxy.engine_client import EngineClient

from fixtures.checkpoints import changed_checkpoint
from fixtures.proxy_on_vllm import (ProxyOnVllm, auth_headers, dialect_request, post,  # noqa: F401 (proxies)
                                    proxies, served_model_dir, RUNS_TO_CAP, RUNS_TO_CAP_TOKENS)

SHORT = "Say hello."


def engine(vllm: Any, op: str, *args: Any) -> Any:
    async def run() -> Any:
        client = EngineClient(vllm.url)
        try:
            return await getattr(client, op)(*args)
        finally:
            await client.aclose()

    return asyncio.run(run())


def stream_through_pause(vllm: Any, proxy: ProxyOnVllm, sync: Callable[[], None]) -> list[dict[str, Any]]:
    """Start a streamed chat call that generates until its cap, run `sync` (which pauses vLLM with mode=abort)
    once tokens flow and before the call could end by itself; the SSE data the harness got."""
    lines: list[str] = []

    def call() -> None:
        path, body = dialect_request("chat", vllm.model, RUNS_TO_CAP, RUNS_TO_CAP_TOKENS, stream=True)
        with httpx.stream("POST", proxy.url + path, json=body, headers=auth_headers("chat"), timeout=120) as r:
            lines.extend(r.iter_lines())

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 60
    while not any('"content":"' in line and '"content":""' not in line for line in lines) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert thread.is_alive() and not any('"finish_reason":"' in line for line in lines), "the call ended before the sync"
    sync()
    thread.join(120)
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


def assert_aborted(proxy: ProxyOnVllm, data: list[dict[str, Any]]) -> None:
    """The harness saw tokens, then its dialect's retryable error, never a finish; the record says aborted,
    and exact mode keeps no turn to splice onto."""
    assert any(c.get("choices") and c["choices"][0]["delta"].get("content") for c in data)
    assert data[-1]["error"]["code"] == "engine_aborted", data[-1]
    assert not any(c.get("choices") and c["choices"][0].get("finish_reason") for c in data)
    rec = next(r for r in reversed(proxy.records()) if r.stream)
    assert (rec.status, rec.error.kind if rec.error else None, rec.finish_reason) == ("partial", "engine_aborted", "abort")
    engine = proxy.app.state.proxy.engine
    if engine.mode == "exact":
        assert rec.call_id not in engine.sessions["s"].calls


def test_calls_a_pause_aborts_are_reported_aborted_never_finished(vllm_server: Any, proxies: Any) -> None:
    proxy = proxies["server"]  # exact mode: in test_weight_sync_end_to_end

    def pause_and_resume() -> None:
        engine(vllm_server, "pause", "abort")
        engine(vllm_server, "resume")

    assert_aborted(proxy, stream_through_pause(vllm_server, proxy, pause_and_resume))


def test_weight_sync_end_to_end(vllm_server: Any, proxies: Any, tmp_path: Path) -> None:
    proxy = proxies["exact"]
    model_dir = Path(served_model_dir(vllm_server.url))
    new_weights = changed_checkpoint(model_dir, tmp_path / "policy-1")
    path, body = dialect_request("chat", vllm_server.model, SHORT, 8)
    assert post(proxy, "chat", path, body).status_code == 200
    before = proxy.records()[-1]
    assert before.policy_version == 0
    took: dict[str, float] = {}

    def weight_sync() -> None:
        proxy.admin("/admin/pause", {"max_wait_s": 60})
        engine(vllm_server, "pause", "abort")
        t0 = time.monotonic()
        engine(vllm_server, "reload_weights", str(new_weights))
        took["reload_s"] = time.monotonic() - t0
        proxy.admin("/admin/policy-version", {"version": 1})
        engine(vllm_server, "set_weight_version", "policy-1")
        engine(vllm_server, "resume")
        proxy.admin("/admin/resume")

    try:
        assert_aborted(proxy, stream_through_pause(vllm_server, proxy, weight_sync))
        assert httpx.get(vllm_server.url + "/weight_info", timeout=10).json() == {"weight_version": "policy-1"}
        assert post(proxy, "chat", path, body).status_code == 200
        after = proxy.records()[-1]
    finally:  # the server is shared by the session's tests: its own weights back
        engine(vllm_server, "pause", "wait")
        engine(vllm_server, "reload_weights", str(model_dir))
        engine(vllm_server, "set_weight_version", "default")
        engine(vllm_server, "resume")
    assert after.policy_version == 1 and before.prompt_ids == after.prompt_ids
    assert after.logprobs[0] != before.logprobs[0], (before.logprobs, after.logprobs)  # other weights sampled
    print(f"weights reloaded in {took['reload_s']:.2f} s")
