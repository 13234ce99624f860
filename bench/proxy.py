"""Bench: what the capture proxy adds on top of the engine, and how it compares with LiteLLM's proxy.

    .venv/bin/python bench/proxy.py [--calls 400] [--concurrency 1 64 256] [--litellm PATH/TO/litellm]

Starts (as separate processes, loopback only) a zero-latency fake engine (bench/fake_engine.py, the
vLLM API subset), `tracefleet proxy` in front of it, a bare pass-through in front of it (the floor:
bench/passthrough.py), and optionally LiteLLM's proxy in front of the same engine; then drives Chat Completions calls at each concurrency, streaming and not, and prints
added latency p50/p99 (target minus direct), calls/s and server CPU per call, with ratios. Capture
logs go to a tmpfs directory by default (--capture-dir to measure a real disk's fsync).

Keeping the LiteLLM comparison fair (its defaults are not what a tuned deployment runs):
- the same shape: one process each (`--num_workers 1`), loopback, the same engine, the same client,
  keep-alive connections, the same calls; each target gets a warm-up round before any cell is timed;
- LiteLLM's cheapest configuration: no database (so no spend logs, budgets or key lookups), only the
  master key check (we check a session secret), `set_verbose: false`, `json_logs: false`,
  `turn_off_message_logging: true`, no callbacks, no telemetry, `LITELLM_LOG=ERROR`, the bundled
  model-cost map (no fetch at start), uvloop (its default) and httptools when installed in its
  environment (`pip install httptools`; without it uvicorn falls back to the pure-Python h11 parser);
- our proxy does strictly more per call: it parses into the canonical model, records prompt/sampled
  token ids and logprobs, and appends + fsyncs a capture record before the last byte.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
BODY = {"model": "fake-model", "messages": [{"role": "system", "content": "You are a coding agent."},
                                            {"role": "user", "content": "Say hello."}], "max_tokens": 16}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 90.0, headers: dict[str, str] | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if httpx.get(url, timeout=2, headers=headers).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up in {timeout}s")


def start(argv: list[str], env: dict[str, str] | None = None, log: Path | None = None) -> subprocess.Popen:
    out = open(log, "wb") if log else subprocess.DEVNULL
    return subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def start_fake_engine(procs: list[subprocess.Popen], tokens: int, log: Path) -> str:
    """bench/fake_engine.py serving `tokens`-token answers in its own process (added to `procs`); its URL."""
    port = free_port()
    procs.append(start([PY, "-c", f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import uvicorn; "
                        f"from fake_engine import fake_engine_app; uvicorn.run(fake_engine_app({tokens}), "
                        f"host='127.0.0.1', port={port}, log_level='warning', access_log=False)"], log=log))
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health")
    return url


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


async def drive(url: str, key: str, concurrency: int, calls: int, stream: bool,
                request: dict | None = None) -> tuple[list[float], float]:
    """`calls` requests (`request`, default BODY) from `concurrency` workers; per-call latency to the last
    byte, and calls/s. aiohttp as the client: httpx's pool is itself the bottleneck at 64+ concurrent streams."""
    import aiohttp

    body = orjson.dumps({**(request or BODY), "stream": stream})
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    lat: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as client:

        async def worker(todo) -> None:
            for _ in todo:
                t0 = time.perf_counter()
                async with client.post(url, data=body, headers=headers) as r:
                    if r.status != 200:
                        raise RuntimeError(f"{url}: HTTP {r.status}: {(await r.read())[:300]!r}")
                    async for _chunk in r.content.iter_any():
                        pass
                lat.append(time.perf_counter() - t0)

        warm = iter(range(min(calls, concurrency * 2)))  # open connections, warm caches
        await asyncio.gather(*(worker(warm) for _ in range(concurrency)))
        lat.clear()
        todo = iter(range(calls))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(todo) for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return lat, calls / elapsed


def cpu_s(pid: int) -> float:
    """CPU seconds of a process (all its threads) and its children: the scheduler's nanosecond run time
    (/proc/PID/task/TID/schedstat), where the kernel keeps it; else user + system from /proc/PID/stat, which
    counts in clock ticks (10 ms: at a few hundred calls per round that alone is ±30 µs per call)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    with contextlib.suppress(OSError):
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for p in pids:
        with contextlib.suppress(OSError):
            threads = list(Path(f"/proc/{p}/task").iterdir())
            if all((t / "schedstat").exists() for t in threads):
                total += sum(int((t / "schedstat").read_text().split()[0]) for t in threads) / 1e9
                continue
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def measure(targets: dict[str, tuple[str, str]], pids: dict[str, int], conc: int, calls: int, rounds: int,
            stream: bool) -> dict[str, tuple[float, float, float, float]]:
    """One cell: each target driven `rounds` times, in turn (a different one first each round), so load that
    comes and goes on a shared machine falls on all of them alike. Per target: p50 and p99 latency over every
    round's calls, calls/s (median round) and server CPU seconds per call."""
    lats: dict[str, list[float]] = {t: [] for t in targets}
    rates: dict[str, list[float]] = {t: [] for t in targets}
    cpu: dict[str, float] = {t: 0.0 for t in targets}
    names = list(targets)
    per_round = max(1, calls // rounds)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            base, key = targets[name]
            c0 = cpu_s(pids[name])
            try:
                lat, rate = asyncio.run(drive(base + "/v1/chat/completions", key, conc, per_round, stream))
            except RuntimeError as exc:  # which server failed, not only its port
                raise RuntimeError(f"{name} (concurrency {conc}, stream {stream}): {exc}") from None
            cpu[name] += (cpu_s(pids[name]) - c0) / (per_round + min(per_round, conc * 2))
            lats[name] += lat
            rates[name].append(rate)
    return {t: (pct(lats[t], 0.5), pct(lats[t], 0.99), sorted(rates[t])[len(rates[t]) // 2], cpu[t] / rounds)
            for t in targets}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=400, help="calls per (target, concurrency, stream) cell")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--tokens", type=int, default=16, help="tokens per fake answer")
    ap.add_argument("--litellm", default=str(Path.home() / ".cache/tracefleet/litellm-venv/bin/litellm"),
                    help="litellm proxy executable ('' to skip); install with pip install 'litellm[proxy]'")
    ap.add_argument("--proxy-launcher", default=None, metavar="SCRIPT",
                    help="run the proxy as `python SCRIPT proxy ...` instead of `python -m tracefleet proxy ...` "
                    "(to bench another build of it, e.g. a checkout of an older commit)")
    ap.add_argument("--before", default=None, metavar="SCRIPT",
                    help="also run the proxy as `python SCRIPT proxy ...` (another build, e.g. the commit before a "
                    "change), interleaved with this one in every cell, and print both beside the floor")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds per cell (default 4)")
    ap.add_argument("--capture-dir", default=None, help="capture dir (default: a fresh dir under /dev/shm)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop the servers we started

    tmp = Path(tempfile.mkdtemp(prefix="tf-bench-"))
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp
    capture = Path(args.capture_dir) if args.capture_dir else Path(tempfile.mkdtemp(prefix="tf-bench-cap-", dir=shm))
    procs: list[subprocess.Popen] = []
    try:
        pport = free_port()
        engine = start_fake_engine(procs, args.tokens, tmp / "engine.log")
        admin, sid, secret = secrets.token_hex(8), "bench", "tfs-" + secrets.token_hex(16)
        launcher = [args.proxy_launcher] if args.proxy_launcher else ["-m", "tracefleet"]
        procs.append(start([PY, *launcher, "proxy", "--engine", engine, "--capture-dir", str(capture),
                            "--admin-token", admin, "--port", str(pport), "--session", f"{sid}:{secret}"],
                           log=tmp / "proxy.log"))
        wait_http(f"http://127.0.0.1:{pport}/health")
        fport = free_port()
        procs.append(start([PY, str(ROOT / "bench" / "passthrough.py"), "--engine", engine, "--port", str(fport)],
                           log=tmp / "floor.log"))
        wait_http(f"http://127.0.0.1:{fport}/health")
        targets = {"direct": (engine, "none"), "floor": (f"http://127.0.0.1:{fport}", "none"),
                   "proxy": (f"http://127.0.0.1:{pport}", secret)}
        if args.litellm and Path(args.litellm).exists():
            lport = free_port()
            cfg = tmp / "litellm.yaml"
            cfg.write_text(  # its cheapest setup: see the module docstring
                "model_list:\n  - model_name: fake-model\n    litellm_params:\n      model: openai/fake-model\n"
                f"      api_base: {engine}/v1\n      api_key: none\n"
                "litellm_settings:\n  telemetry: false\n  drop_params: true\n  set_verbose: false\n"
                "  json_logs: false\n  turn_off_message_logging: true\n  callbacks: []\n"
                "general_settings:\n  master_key: sk-bench\n  disable_spend_logs: true\n"
                "  disable_error_logs: true\n")
            procs.append(start([args.litellm, "--config", str(cfg), "--host", "127.0.0.1", "--port", str(lport),
                                "--num_workers", "1"],
                               env={"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "NO_DOCS": "True",
                                    "DISABLE_SCHEMA_UPDATE": "True", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
                               log=tmp / "litellm.log"))
            wait_http(f"http://127.0.0.1:{lport}/health/liveliness", timeout=180)
            targets["litellm"] = (f"http://127.0.0.1:{lport}", "sk-bench")
        else:
            print(f"# litellm not found at {args.litellm!r}: LiteLLM columns skipped")

        pids = {"direct": procs[0].pid, "proxy": procs[1].pid, "floor": procs[2].pid, "litellm": procs[-1].pid}
        if args.before:  # the same proxy, built from another checkout (`--before`): interleaved with this one
            bport = free_port()
            procs.append(start([PY, args.before, "proxy", "--engine", engine, "--capture-dir", str(capture),
                                "--admin-token", admin, "--port", str(bport), "--session", f"{sid}-before:{secret}-b"],
                               log=tmp / "before.log"))
            wait_http(f"http://127.0.0.1:{bport}/health")
            targets["before"] = (f"http://127.0.0.1:{bport}", f"{secret}-b")
            pids["before"] = procs[-1].pid
        for name, (base, key) in targets.items():  # warm-up: lazy imports, pools, caches
            for stream in (False, True):
                asyncio.run(drive(base + "/v1/chat/completions", key, 8, 200, stream))
        load0 = os.getloadavg()
        print(f"# fake engine: {args.tokens} tokens/answer, {args.calls} calls per cell in {args.rounds} interleaved "
              f"rounds; capture dir {capture}; one server process each; load average {load0[0]:.2f} {load0[1]:.2f} "
              f"{load0[2]:.2f} on {os.cpu_count()} CPUs")
        print("# +p50/+p99 = added latency vs direct; cpu = server CPU ms per call; floor = bench/passthrough.py (a bare "
              "uvicorn + aiohttp relay: the hop's own cost on this machine)"
              + ("; before = --before " + args.before if args.before else ""))
        cols = [t for t in ("proxy", "before", "litellm") if t in targets]
        print(f"{'stream':>6} {'conc':>4} | {'direct p50':>10} {'calls/s':>8} | {'floor +p50':>10} {'cpu':>5} | "
              + " | ".join(f"{t + ' +p50':>13} {'+p99':>7} {'calls/s':>8} {'cpu':>5}" for t in cols)
              + " || " + " | ".join(f"{t + '/floor +p50':>18} {'cpu':>5}" for t in cols)
              + (f" || {'proxy/litellm calls/s':>21} {'litellm/proxy +p50':>18} {'cpu':>5}" if "litellm" in targets else ""))
        for stream in (False, True):
            for conc in args.concurrency:
                res = measure(targets, pids, conc, args.calls, args.rounds, stream)
                d, f = res["direct"], res["floor"]
                added = {t: (res[t][0] - d[0], res[t][1] - d[1]) for t in res}
                line = (f"{str(stream):>6} {conc:>4} | {d[0]*1e3:8.2f}ms {d[2]:8.0f} | "
                        f"{added['floor'][0]*1e3:+8.2f}ms {f[3]*1e3:5.2f} | ")
                line += " | ".join(f"{added[t][0]*1e3:+11.2f}ms {added[t][1]*1e3:+7.2f} {res[t][2]:8.0f} {res[t][3]*1e3:5.2f}"
                                   for t in cols)
                line += " || " + " | ".join(f"{added[t][0] / max(added['floor'][0], 1e-6):17.2f}x {res[t][3] / f[3]:4.2f}x"
                                            for t in cols)
                if "litellm" in res:
                    p, lt = res["proxy"], res["litellm"]
                    line += (f" || {p[2] / lt[2]:20.1f}x {added['litellm'][0] / max(added['proxy'][0], 1e-6):17.1f}x "
                             f"{lt[3] / max(p[3], 1e-9):4.1f}x")
                print(line, flush=True)
        load1 = os.getloadavg()
        print(f"# load average at the end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}; X/floor = X's added p50 (cpu per "
              "call) over the floor's: the issue's target is <= 1.25x for the proxy"
              + ("; litellm/proxy = LiteLLM's added p50 (cpu) over the proxy's" if "litellm" in targets else ""))
        records = sum(1 for _ in (capture / f"{sid}.jsonl").open("rb"))
        print(f"# proxy capture log: {records} records fsync'd")
    finally:
        for p in reversed(procs):
            stop(p)
        if not args.capture_dir:
            shutil.rmtree(capture, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
