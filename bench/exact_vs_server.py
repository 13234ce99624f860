"""Exact vs server capture mode on the CPU engine over one N-turn chat session.

    .venv/bin/python bench/exact_vs_server.py --turns 20 [--max-tokens 32]

Starts `tracefleet engine` (SmolLM2, llama.cpp, 1 thread), then runs the same conversation through the
proxy app in each mode: the harness echoes each answer back as text (stripped, as most harnesses do)
and asks the next question. Reports per mode: wall time, prompt tokens, tokens the engine had to
prefill (the llama backend keeps the longest common prefix of its previous sequence, like vLLM's
prefix cache: prefilled = prompt - common prefix with previous prompt + completion), and how many calls
extend the previous call exactly (one trace) vs drift. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from tracefleet.capture import read_capture_log
from tracefleet.formats.families import load_model_format
from tracefleet.proxy.app import create_app
from tracefleet.proxy.config import PresetSession, ProxyConfig
from tracefleet.proxy.engine_client import EngineClient
from tracefleet.proxy.exact.engine import ExactTokenEngine
from tracefleet.proxy.token_engine import ServerTokenEngine

QUESTIONS = ["Name a color.", "Name a fruit of that color.", "How does it taste?", "Where does it grow?",
             "Is it healthy?", "How do you store it?", "Name a recipe with it.", "How long does it cook?",
             "What goes well with it?", "Is it expensive?"]
SECRET = "bench-secret-0123456789"


def start_engine() -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.Popen([sys.executable, "-m", "tracefleet.cli", "engine", "--backend", "llama", "--model", "smollm2",
                             "--threads", "1", "--host", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("{") and '"listening"' in line:
            url = json.loads(line)["url"]
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
            for _ in range(600):
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        return proc, url
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
    proc.kill()
    raise SystemExit("engine did not start (run `bash hack/setup.d/40-engine.sh`)")


def serve(app: Any) -> tuple[uvicorn.Server, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}"


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def run_mode(mode: str, engine_url: str, turns: int, max_tokens: int) -> dict[str, Any]:
    capture = Path(tempfile.mkdtemp(prefix=f"tf-bench-{mode}-"))
    config = ProxyConfig(engine_url=engine_url, capture_dir=capture, admin_token="admin", mode=mode,
                         sessions=[PresetSession(session_id="b", secret=SECRET)])
    client = EngineClient(engine_url)
    token_engine = ExactTokenEngine(client, load_model_format("smollm2")) if mode == "exact" \
        else ServerTokenEngine(client)
    server, url = serve(create_app(config, token_engine=token_engine))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You answer briefly."}]
    t0 = time.perf_counter()
    with httpx.Client(base_url=url, timeout=600, headers={"authorization": f"Bearer {SECRET}"}) as http:
        for k in range(turns):
            messages.append({"role": "user", "content": QUESTIONS[k % len(QUESTIONS)] + (f" ({k})" if k >= len(QUESTIONS) else "")})
            r = http.post("/v1/chat/completions", json={"model": "smollm2", "messages": messages, "temperature": 0,
                                                        "max_tokens": max_tokens})
            r.raise_for_status()
            messages.append({"role": "assistant", "content": (r.json()["choices"][0]["message"]["content"] or "").strip()})
    wall = time.perf_counter() - t0
    server.should_exit = True
    recs = read_capture_log(capture / "b.jsonl").records
    prefilled, exact_links, kv = 0, 0, None
    for rec in recs:
        prefilled += len(rec.prompt_ids) - (min(common_prefix(kv, rec.prompt_ids), len(rec.prompt_ids) - 1) if kv else 0)
        if kv is not None and rec.prompt_ids[:len(kv)] == kv:
            exact_links += 1
        kv = rec.prompt_ids + rec.completion_ids
    return {"mode": mode, "calls": len(recs), "wall_s": round(wall, 2),
            "prompt_tokens": sum(len(r.prompt_ids) for r in recs), "prefilled_tokens": prefilled,
            "exact_links": exact_links, "drift_links": len(recs) - 1 - exact_links,
            "completion_tokens": sum(len(r.completion_ids) for r in recs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    proc, url = start_engine()
    try:
        server = run_mode("server", url, args.turns, args.max_tokens)
        exact = run_mode("exact", url, args.turns, args.max_tokens)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(json.dumps({"server": server, "exact": exact,
                      "prefill_ratio_exact_over_server": round(exact["prefilled_tokens"] / max(1, server["prefilled_tokens"]), 3),
                      "wall_ratio_exact_over_server": round(exact["wall_s"] / max(1e-9, server["wall_s"]), 3)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
