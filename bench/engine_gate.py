"""Bench: what the engine gate (`tracefleet engine-gate`) costs in front of an engine: the latency it adds per call
and its CPU per call and per streamed chunk, against a zero-latency fake engine (bench/fake_engine.py), at each
concurrency. Sizes the gate container's CPU request (operator/children/inference.py).

    .venv/bin/python bench/engine_gate.py [--tokens 256] [--calls 400] [--concurrency 1 16 64]

Each row: the same streamed calls straight to the engine and through the gate (one process each, as in the pod):
median and p95 latency to the last byte, calls/s, and the gate's CPU seconds per call and per chunk (a chunk is one
SSE event), and its memory at the end. The machine's cores are shared by the engine, the gate and the client, so
calls/s is a floor. The fake engine writes an answer's events back to back, so one read of the gate often carries
several: on a real engine, whose tokens come apart, each event costs the gate a read and a write of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

from proxy import PY, cpu_s, drive, free_port, pct, start, start_fake_engine, stop, wait_http  # bench/proxy.py


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="tokens (SSE chunks) per answer")
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    args = parser.parse_args()
    procs = []
    with tempfile.TemporaryDirectory(prefix="tf-gate-") as tmp:
        try:
            engine = start_fake_engine(procs, args.tokens, Path(tmp) / "engine.log")
            key, port = secrets.token_urlsafe(32), free_port()
            procs.append(start([PY, "-m", "tracefleet", "engine-gate", "--engine", engine, "--host", "127.0.0.1",
                                "--port", str(port)], env={"TRACEFLEET_ENGINE_API_KEY": key}, log=Path(tmp) / "gate.log"))
            gate = f"http://127.0.0.1:{port}"
            wait_http(gate + "/health")
            gate_pid = procs[-1].pid
            print(f"{args.tokens} tokens per answer, {args.calls} streamed calls per row")
            print(f"{'conc':>5} {'direct p50 ms':>14} {'gated p50 ms':>13} {'direct p95':>11} {'gated p95':>10} "
                  f"{'direct calls/s':>15} {'gated calls/s':>14} {'gate CPU ms/call':>17} {'gate CPU us/chunk':>18}")
            for conc in args.concurrency:
                direct, direct_rate = asyncio.run(drive(engine + "/v1/chat/completions", key, conc, args.calls, True))
                c0 = cpu_s(gate_pid)
                gated, gated_rate = asyncio.run(drive(gate + "/v1/chat/completions", key, conc, args.calls, True))
                cpu = (cpu_s(gate_pid) - c0) / (args.calls + min(args.calls, conc * 2))  # drive's warm-up calls too
                print(f"{conc:>5} {statistics.median(direct) * 1e3:>14.1f} {statistics.median(gated) * 1e3:>13.1f} "
                      f"{pct(direct, 0.95) * 1e3:>11.1f} {pct(gated, 0.95) * 1e3:>10.1f} {direct_rate:>15.1f} "
                      f"{gated_rate:>14.1f} {cpu * 1e3:>17.2f} {cpu / (args.tokens + 2) * 1e6:>18.1f}")
                time.sleep(0.5)
            status = dict(line.split(":", 1) for line in Path(f"/proc/{gate_pid}/status").read_text().splitlines()
                          if ":" in line)
            print(f"gate memory: {int(status['VmRSS'].split()[0]) / 1024:.0f} MiB resident, peak "
                  f"{int(status['VmHWM'].split()[0]) / 1024:.0f} MiB")
        finally:
            for p in reversed(procs):
                stop(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
