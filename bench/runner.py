"""Local-mode throughput: a 50-session job (25 tasks x 2 samples, parallelism 8) through `tracefleet run`
against the scripted engine, with the quickstart agent as the harness and the tests evaluator.

    .venv/bin/python bench/runner.py [--sessions 50] [--parallelism 8] [--netns auto|on|off]

Prints sessions/minute, the peak resident memory of the whole `tracefleet run` process tree (runner,
proxy, harnesses, evaluators; the engine is measured separately), and the stage timings. Not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TASKS = ["calc", "textutil", "inventory"]


def tree_rss_kb(root: int) -> int:
    """Sum of VmRSS over root and all its descendants."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(proc.name))
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def start_scripted_engine() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracefleet.cli", "engine", "--backend", "scripted", "--model", "smollm2",
         "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{") and '"listening"' in line:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
            return proc, json.loads(line)["url"]
    raise SystemExit(f"scripted engine did not start (exit {proc.wait()})")


def write_job(root: Path, sessions: int, parallelism: int) -> Path:
    tasks = []
    for i in range((sessions + 1) // 2):
        name = TASKS[i % len(TASKS)]
        tasks.append({
            "id": f"{name}-{i}", "prompt": f"Fix the bug in {name}.py so the tests pass.",
            "workspace": {"repo": str(REPO / "examples" / "quickstart" / "tasks" / name)},
        })
    job = {
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "bench-runner"},
        "spec": {
            "inference": {"external": {"baseUrl": "http://127.0.0.1:1"}, "capture": {"mode": "server"}},
            "harness": {"preset": "command", "command": ["python", str(REPO / "examples/quickstart/agent.py"), "{prompt}"],
                        "env": {"AGENT_MAX_TURNS": "2"}, "sessionTimeoutSeconds": 300},
            "tasks": {"samplesPerTask": 2, "inline": tasks},
            "evaluator": {"preset": "tests", "timeoutSeconds": 120},
            "output": {"uri": str(root / "out"), "tracesPerBatch": 16},
            "parallelism": parallelism,
        },
    }
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--parallelism", type=int, default=8)
    parser.add_argument("--netns", default="auto", choices=("auto", "on", "off"))
    args = parser.parse_args()
    engine, url = start_scripted_engine()
    try:
        with tempfile.TemporaryDirectory(prefix="tracefleet-bench-") as tmp:
            root = Path(tmp)
            job = write_job(root, args.sessions, args.parallelism)
            started = time.monotonic()
            run = subprocess.Popen(
                [sys.executable, "-m", "tracefleet.cli", "run", str(job), "--engine-url", url,
                 "--work-dir", str(root / "work"), "--netns", args.netns, "--keep-workspaces"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            peak = 0
            while run.poll() is None:
                peak = max(peak, tree_rss_kb(run.pid))
                time.sleep(0.25)
            elapsed = time.monotonic() - started
            output = run.stdout.read() if run.stdout else ""
            results = [json.loads(p.read_text()) for p in (root / "work" / "sessions").glob("*/*/result.json")]
            engine_rss = tree_rss_kb(engine.pid)
        statuses: dict[str, int] = {}
        for r in results:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        print(output.strip().splitlines()[-14:] and "\n".join(output.strip().splitlines()[-14:]))
        print(f"\nsessions            {len(results)} ({statuses}), parallelism {args.parallelism}, exit {run.returncode}")
        print(f"wall time           {elapsed:.1f} s (engine start excluded)")
        print(f"throughput          {len(results) / elapsed * 60:.1f} sessions/minute")
        print(f"peak RSS (run tree) {peak / 1024:.0f} MiB   scripted engine RSS {engine_rss / 1024:.0f} MiB")
        for stage in ("prepare", "register", "harness", "capture", "collect", "evaluate", "build", "total"):
            values = [r["timings"][stage] for r in results if stage in r["timings"]]
            if values:
                print(f"  {stage:<9} median {statistics.median(values):6.2f} s   max {max(values):6.2f} s")
        return 0 if run.returncode == 0 else 1
    finally:
        engine.terminate()
        engine.wait(timeout=10)


if __name__ == "__main__":
    raise SystemExit(main())
