"""Bench: the proxy sidecar's resident memory and CPU under load, per capture mode: the numbers the harness
pod's sidecar requests and limits come from (operator/children/sidecar_resources.py).

    .venv/bin/python bench/sidecar.py [--calls 400] [--turns 300] [--growth 1500] [--modes server exact]
                                      [--exact-models smollm2 gemma3-270m]

For each capture mode it starts `tracefleet proxy` (one process, as in a pod: one session) in front of a
zero-latency fake engine (bench/fake_engine.py: chat for server mode, token-id /v1/completions for exact
mode, answering with the model's own token ids so that exact mode splices as it does on a real engine) and
reports, per phase (exact mode once per `--exact-models` tokenizer: SmolLM2's 49k vocabulary and Gemma 3's
262k, the largest of the supported families, as Qwen3's is 151k and Llama 3's 128k): resident memory at the end (RSS) and its peak (VmHWM, reset between phases), CPU
seconds and CPU per call, and calls/s.

Phases: `idle` (started, one call served), `whole` and `stream` (`--calls` calls at concurrency 1 and 8,
a short conversation: a harness and its subagents), and `long` (one session of `--turns` turns whose history
grows by `--growth` characters of tool output per turn, streamed: a long agent session, its capture log
and, in exact mode, its served token ids; every call sends the whole history, as harnesses do).

Then the defaults it derives: memory request = the highest peak × 1.25 (headroom for what the bench does not
drive: larger single requests, a slow disk's write queue), memory limit = 2 × the request, CPU request =
the busiest phase's CPU per call × 2 calls/s (a session on a fast engine) × 1.25, at least 50m; no CPU
limit (a throttled sidecar adds its wait to every model call). Rounded up to 16 Mi / 10 m.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import secrets
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from proxy import PY, ROOT, cpu_s, drive, free_port, start, stop, wait_http  # bench/proxy.py

HEADROOM = 1.25
LIMIT_OVER_REQUEST = 2
CALLS_PER_S = 2.0  # the busiest session the CPU request is sized for
MIN_CPU_M = 50
ANSWER = "Sure. I read the file; the failing test expects port 8081, so I will change the constant and rerun it."


def memory_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def reset_peak(pid: int) -> None:
    """Start VmHWM again from the current RSS (Linux: 5 into clear_refs)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def answer_tokens(model: str) -> list[tuple[int, str]]:
    """ANSWER as the model's token ids and their text pieces, ended by its end-of-turn token."""
    from tracefleet.formats.families import load_model_format

    fmt = load_model_format(model)
    ids = fmt.encode(ANSWER)
    pieces, done = [], ""
    for n in range(1, len(ids) + 1):  # each id's text: the growth of the decoded prefix
        text = fmt.tokenizer.decode(ids[:n])
        pieces.append(text[len(done):])
        done = text
    return [*zip(ids, pieces), (fmt.end_of_turn_id, fmt.family.end_of_turn)]


async def long_session(url: str, key: str, turns: int, growth: int) -> tuple[int, int]:
    """One session of `turns` streamed calls, each sending the whole history: (calls, history characters)."""
    import aiohttp

    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Fix the failing test in this repository."}]
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    filler = ("def handler(request):\n    return respond(request.path, status=200)\n" * (growth // 64 + 1))[:growth]
    async with aiohttp.ClientSession() as client:
        for turn in range(turns):
            body = orjson.dumps({"model": "fake-model", "messages": messages, "max_tokens": 64, "stream": True})
            async with client.post(url, data=body, headers=headers) as r:
                if r.status != 200:
                    raise RuntimeError(f"turn {turn}: HTTP {r.status}: {(await r.read())[:300]!r}")
                text = []
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        for choice in orjson.loads(line[6:]).get("choices") or ():
                            text.append((choice.get("delta") or {}).get("content") or "")
            messages.append({"role": "assistant", "content": "".join(text)})
            messages.append({"role": "user", "content": f"Tool output (turn {turn}):\n{filler}"})
    return turns, sum(len(m["content"]) for m in messages)


def bench_mode(mode: str, model: str, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    procs = []
    capture = Path(tempfile.mkdtemp(prefix=f"tf-sidecar-{mode}-", dir=tmp))
    try:
        eport, pport = free_port(), free_port()
        engine = f"http://127.0.0.1:{eport}"
        answer = answer_tokens(model)
        procs.append(start([PY, "-c", f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import uvicorn; "
                            f"from fake_engine import fake_engine_app; uvicorn.run(fake_engine_app(answer={answer!r}), "
                            f"host='127.0.0.1', port={eport}, log_level='warning', access_log=False)"],
                           log=tmp / f"engine-{mode}.log"))
        wait_http(engine + "/health")
        sid, secret = "bench", "tfs-" + secrets.token_hex(16)
        extra = ["--model-path", model] if mode == "exact" else []
        procs.append(start([PY, "-m", "tracefleet", "proxy", "--engine", engine, "--capture-dir", str(capture),
                            "--port", str(pport), "--session", f"{sid}:{secret}", "--mode", mode,
                            "--served-model", "fake-model", *extra], log=tmp / f"proxy-{mode}.log"))
        base = f"http://127.0.0.1:{pport}"
        wait_http(base + "/health")
        pid = procs[-1].pid
        url = base + "/v1/chat/completions"
        rows = []

        def phase(name: str, run: Any) -> None:
            reset_peak(pid)
            c0, t0 = cpu_s(pid), time.perf_counter()
            calls = run()
            wall, cpu = time.perf_counter() - t0, cpu_s(pid) - c0
            rss, peak = memory_kib(pid)
            rows.append({"mode": mode, "model": model, "phase": name, "calls": calls, "rss_mib": rss / 1024, "peak_mib": peak / 1024,
                         "cpu_s": cpu, "cpu_ms_per_call": cpu / max(calls, 1) * 1e3, "calls_per_s": calls / wall,
                         "log_mib": sum(p.stat().st_size for p in capture.glob("*.jsonl")) / 2**20})

        def calls(conc: int, stream: bool) -> Any:
            def run() -> int:
                asyncio.run(drive(url, secret, conc, args.calls, stream))
                return args.calls + min(args.calls, conc * 2)  # drive's warm-up calls count too
            return run

        phase("idle", lambda: (asyncio.run(drive(url, secret, 1, 1, False)), 3)[1])
        for stream in (False, True):
            for conc in (1, 8):
                phase(f"{'stream' if stream else 'whole'} c={conc}", calls(conc, stream))
        phase(f"long {args.turns} turns", lambda: asyncio.run(long_session(url, secret, args.turns, args.growth))[0])
        return rows
    finally:
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(capture, ignore_errors=True)


def derive(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode: the requests/limits the measured peaks and CPU give (see the module docstring)."""
    out = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        peak = max(r["peak_mib"] for r in mine)
        cpu_per_call = max(r["cpu_ms_per_call"] for r in mine if r["phase"] != "idle")
        request = math.ceil(peak * HEADROOM / 16) * 16
        cpu = max(MIN_CPU_M, math.ceil(cpu_per_call * CALLS_PER_S * HEADROOM / 10) * 10)
        out[mode] = {"peak_mib": round(peak, 1), "cpu_ms_per_call": round(cpu_per_call, 2),
                     "requests": {"cpu": f"{cpu}m", "memory": f"{request}Mi"},
                     "limits": {"memory": f"{request * LIMIT_OVER_REQUEST}Mi"}}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=400, help="calls per whole/stream phase")
    ap.add_argument("--turns", type=int, default=300, help="turns of the long session")
    ap.add_argument("--growth", type=int, default=1500, help="characters of tool output the history grows by per turn")
    ap.add_argument("--modes", nargs="+", default=["server", "exact"], choices=["server", "exact"])
    ap.add_argument("--exact-models", nargs="+", default=["smollm2", "gemma3-270m"],
                    help="tokenizers exact mode is measured with (the default's is the largest of them)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    tmp = Path(tempfile.mkdtemp(prefix="tf-sidecar-", dir=shm))
    try:
        runs = [(mode, model) for mode in args.modes for model in (args.exact_models if mode == "exact" else ["smollm2"])]
        rows = [row for mode, model in runs for row in bench_mode(mode, model, args, tmp)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"# one proxy process per mode, one session, fake zero-latency engine; capture log on tmpfs "
          f"(not in RSS); peak = VmHWM since the phase began")
    print(f"{'mode':>6} {'tokenizer':>11} {'phase':>18} | {'calls':>6} {'calls/s':>8} | {'RSS MiB':>8} {'peak MiB':>8} | "
          f"{'CPU s':>6} {'ms/call':>7} | {'log MiB':>7}")
    for r in rows:
        tokenizer = r["model"] if r["mode"] == "exact" else "-"
        print(f"{r['mode']:>6} {tokenizer:>11} {r['phase']:>18} | {r['calls']:6d} {r['calls_per_s']:8.0f} | {r['rss_mib']:8.1f} "
              f"{r['peak_mib']:8.1f} | {r['cpu_s']:6.2f} {r['cpu_ms_per_call']:7.2f} | {r['log_mib']:7.1f}")
    print(f"# defaults: memory request = peak x {HEADROOM}, limit = {LIMIT_OVER_REQUEST} x request; cpu request = "
          f"max ms/call x {CALLS_PER_S:g} calls/s x {HEADROOM}, at least {MIN_CPU_M}m; no cpu limit")
    print(orjson.dumps(derive(rows), option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
