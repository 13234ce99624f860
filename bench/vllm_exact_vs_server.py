"""Exact vs server capture mode on real vLLM (its CPU build, SmolLM2): a 20-call tool-using session.

    .venv/bin/python bench/vllm_exact_vs_server.py [--vllm-url URL] [--calls 20] [--max-tokens 24]

Needs a vLLM started with the operator's arguments (`tracefleet engine --backend vllm`, or the test suite's
dev server): --vllm-url, else $TRACEFLEET_VLLM_URL. The same session runs through the proxy app once per
mode (server: vLLM renders the chat template and parses tool calls with its hermes parser; exact: the proxy
renders, splices and sends token ids to /v1/completions). The bench is the harness: 5 tasks x (3 tool
calls + 1 answer), each tool call answered with a tool message, the assistant turn echoed back the way
Chat-API harnesses do (arguments re-serialised compactly, content `.strip()`ed), the next task's user turn
after each answer. SmolLM2-135M does not call tools by itself, so the tool-call turns are forced the way
vLLM forces `tool_choice: "required"`, by structured outputs (tests/fixtures/proxy_on_vllm.py's
`force_tool_calls`: a regex for one hermes `<tool_call>` block, the command left to the model, added to
the engine request at the proxy's engine client in both modes). The model then keeps calling tools on
the answer turns too (measured: all 20 calls); that is its own choice, the same in both modes.
Each mode's system prompt starts with a fresh nonce, so neither finds the other's (or an earlier run's)
prefix in vLLM's cache.

Reported per mode, from vLLM's own /metrics (deltas over the session): prompt tokens, tokens prefilled
(`vllm:prompt_tokens_by_source_total{source="local_compute"}`), prefix-cache hits/queries and their ratio;
wall time; exact links (a prompt extending the previous prompt + sampled ids) vs drift links, from the
capture log. Then exact/server ratios. Prints one JSON object. The counters are the server's: run it while
nothing else uses that vLLM, or read the figures as upper bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from exact_vs_server import serve
from prometheus_client.parser import text_string_to_metric_families

from tracefleet.contract.capture import read_capture_log
from tracefleet.proxy.app import create_app
from tracefleet.proxy.config import PresetSession, ProxyConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fixtures.proxy_on_vllm import BASH_TOOL, echoed_history, force_tool_calls  # noqa: E402

SECRET = "bench-secret-0123456789"
TASKS = ["Find out what the project holds.", "Check which tests exist.", "See how big the source tree is.",
         "Look for a configuration file.", "Find the entry point."]
CALLS_PER_TASK = 4  # 3 tool calls + the answer
COUNTERS = {"prompt_tokens": ("vllm:prompt_tokens_total", None),
            "prefilled_tokens": ("vllm:prompt_tokens_by_source_total", ("source", "local_compute")),
            "cache_hits": ("vllm:prefix_cache_hits_total", None),
            "cache_queries": ("vllm:prefix_cache_queries_total", None)}


def counters(vllm_url: str) -> dict[str, float]:
    text = httpx.get(vllm_url + "/metrics", timeout=10).raise_for_status().text
    out = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for key, (name, label) in COUNTERS.items():
                if sample.name == name and (label is None or sample.labels.get(label[0]) == label[1]):
                    out[key] += sample.value
    return out


def session(http: httpx.Client, model: str, calls: int, max_tokens: int, nonce: str) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"[{nonce}] You are a coding agent with a bash tool."}]
    for n in range(calls):
        if n % CALLS_PER_TASK == 0:
            messages.append({"role": "user", "content": TASKS[n // CALLS_PER_TASK % len(TASKS)]})
        r = http.post("/v1/chat/completions", json={"model": model, "messages": messages, "tools": [BASH_TOOL],
                                                    "temperature": 0, "max_tokens": max_tokens})
        r.raise_for_status()
        messages += echoed_history(r.json()["choices"][0]["message"], f"README.md\nsrc\ntests\nstep{n}.log")


def run_mode(mode: str, vllm_url: str, model: str, calls: int, max_tokens: int) -> dict[str, Any]:
    capture = Path(tempfile.mkdtemp(prefix=f"tf-bench-vllm-{mode}-"))
    model_dir = httpx.get(vllm_url + "/v1/models", timeout=10).raise_for_status().json()["data"][0]["root"]
    config = ProxyConfig(engine_url=vllm_url, capture_dir=capture, admin_token="admin", mode=mode, served_model=model,
                         model_path=model_dir if mode == "exact" else None,
                         sessions=[PresetSession(session_id="b", secret=SECRET)])
    app = create_app(config)
    sent = force_tool_calls(app, lambda n: n % CALLS_PER_TASK != CALLS_PER_TASK - 1)
    server, url = serve(app)
    before = counters(vllm_url)
    t0 = time.perf_counter()
    try:
        with httpx.Client(base_url=url, timeout=600, headers={"authorization": f"Bearer {SECRET}"}) as http:
            session(http, model, calls, max_tokens, nonce=uuid.uuid4().hex)
    finally:
        server.should_exit = True
    wall = time.perf_counter() - t0
    after = counters(vllm_url)
    delta = {k: after[k] - before[k] for k in COUNTERS}
    recs = read_capture_log(capture / "b.jsonl").records
    exact_links = sum(cur.prompt_ids[:len(prev.prompt_ids) + len(prev.completion_ids)]
                      == prev.prompt_ids + prev.completion_ids for prev, cur in zip(recs, recs[1:]))
    return {"mode": mode, "calls": len(recs), "wall_s": round(wall, 1),
            "prompt_tokens_logged": sum(len(r.prompt_ids) for r in recs),
            "completion_tokens": sum(len(r.completion_ids) for r in recs),
            **{k: int(v) for k, v in delta.items()},
            "cache_hit_ratio": round(delta["cache_hits"] / max(1.0, delta["cache_queries"]), 3),
            "exact_links": exact_links, "drift_links": len(recs) - 1 - exact_links,
            "calls_with_tool_calls": sum(bool(r.tool_calls) for r in recs), "engine_requests": len(sent)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-url", default=os.environ.get("TRACEFLEET_VLLM_URL"))
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=40, help="room for a forced tool call (~24-30 tokens)")
    args = ap.parse_args()
    if not args.vllm_url:
        print("bench/vllm_exact_vs_server.py: give --vllm-url (or TRACEFLEET_VLLM_URL): a vLLM started with "
              "`tracefleet engine --backend vllm`")
        return 2
    url = args.vllm_url.rstrip("/")
    model = httpx.get(url + "/v1/models", timeout=10).raise_for_status().json()["data"][0]["id"]
    modes = {m: run_mode(m, url, model, args.calls, args.max_tokens) for m in ("server", "exact")}
    s, e = modes["server"], modes["exact"]
    ratios = {"prefilled_tokens": round(e["prefilled_tokens"] / max(1, s["prefilled_tokens"]), 3),
              "cache_hit_ratio": round(e["cache_hit_ratio"] / max(1e-9, s["cache_hit_ratio"]), 3),
              "wall_s": round(e["wall_s"] / s["wall_s"], 3)}
    print(json.dumps({"vllm": url, "model": model, "modes": modes, "exact_over_server": ratios}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
