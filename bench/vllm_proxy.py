"""Bench: what the capture proxy adds on top of real vLLM (its CPU build, SmolLM2), at c=1 and c=16.

    .venv/bin/python bench/vllm_proxy.py [--calls 16] [--concurrency 1 16] [--tokens 16] [--vllm-url URL]

Starts vLLM with the arguments the operator gives it (tracefleet.engine.vllm_local.launch; needs
hack/setup.d/45-vllm.sh) unless --vllm-url names one already running, then `tracefleet proxy` (server mode)
in front of it, and drives the same Chat Completions call at each concurrency, streaming and not, directly
and through the proxy: p50/p99 latency to the last byte, calls/s, and the proxy's added p50 as a share of
the direct call. Every call samples exactly --tokens tokens (`ignore_eos`), so both paths do the same work.
On this machine vLLM and the proxy share the same 2 cores: the proxy's CPU is taken from the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from proxy import PY, drive, free_port, pct, start, stop, wait_http

from tracefleet.engine.vllm_local import attach, launch

MESSAGES = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Say hello and list three shell commands."}]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=16, help="calls per (target, concurrency, stream) cell")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--tokens", type=int, default=16, help="tokens sampled per call")
    ap.add_argument("--vllm-url", default=None, help="a vLLM already started with the same arguments")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop the servers we started

    tmp = Path(tempfile.mkdtemp(prefix="tf-bench-vllm-"))
    procs = []
    t0 = time.monotonic()
    vllm = attach(args.vllm_url) if args.vllm_url else launch(log=tmp / "vllm.log")
    started_s = time.monotonic() - t0
    try:
        admin, sid, secret = secrets.token_hex(8), "bench", "tfs-" + secrets.token_hex(16)
        pport = free_port()
        procs.append(start([PY, "-m", "tracefleet", "proxy", "--engine", vllm.url, "--capture-dir", str(tmp / "cap"),
                            "--admin-token", admin, "--port", str(pport), "--session", f"{sid}:{secret}"],
                           log=tmp / "proxy.log"))
        wait_http(f"http://127.0.0.1:{pport}/health")
        request = {"model": vllm.model, "messages": MESSAGES, "max_tokens": args.tokens, "ignore_eos": True}
        targets = {"direct": (vllm.url, "none"), "proxy": (f"http://127.0.0.1:{pport}", secret)}
        print(f"# vLLM {vllm.url} ({'given' if args.vllm_url else f'started in {started_s:.0f} s'}), "
              f"{args.tokens} tokens/call, {args.calls} calls per cell; proxy in server mode, capture to {tmp}")
        print(f"{'stream':>6} {'conc':>4} | {'direct p50':>10} {'p99':>8} {'calls/s':>7} | "
              f"{'proxy p50':>10} {'p99':>8} {'calls/s':>7} | {'+p50':>9} {'+p50 share':>10}")
        for stream in (False, True):
            for conc in args.concurrency:
                res = {}
                for name, (base, key) in targets.items():
                    lat, rate = asyncio.run(drive(base + "/v1/chat/completions", key, conc, args.calls, stream,
                                                  request))
                    res[name] = (pct(lat, 0.5), pct(lat, 0.99), rate)
                d, p = res["direct"], res["proxy"]
                print(f"{str(stream):>6} {conc:>4} | {d[0]*1e3:8.0f}ms {d[1]*1e3:6.0f}ms {d[2]:7.2f} | "
                      f"{p[0]*1e3:8.0f}ms {p[1]*1e3:6.0f}ms {p[2]:7.2f} | {(p[0]-d[0])*1e3:+7.0f}ms "
                      f"{(p[0]-d[0])/d[0]:+10.1%}", flush=True)
    finally:
        for proc in reversed(procs):
            stop(proc)
        vllm.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
