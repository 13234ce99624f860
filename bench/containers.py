"""A session in its task's container vs on the host, through `tracefleet run`: the same tasks, the same real harness
(Pi) against the scripted engine (two shell rounds: `echo tracefleet > note.txt`, `ls`, then an answer).

    .venv/bin/python bench/containers.py [--tasks 20] [--samples 2] [--parallelism 4 [2 1 ...]] [--rounds 1]

Three jobs run one after the other:
  harbor cold   the tasks as Harbor folders (a Dockerfile FROM localhost/debian:bookworm with a RUN of its own, so each
                image is a new build), each session in a container of its image, judged by the `harbor` preset
                (the change set + test.sh in a fresh container: reward 1 if /app/note.txt exists)
  harbor warm   the same folders again under another job name: every image found by content (cache hits)
  host          the same prompts as inline tasks, each session on the host (process group, HOME, workspace), judged
                by the `command` preset (`test -f note.txt`)
Prints per session (median and mean over every session, from each result.json's stage timings): the harness stage
(the container's start, the harness, its stop), the evaluate stage (change set + verify vs a host command) and the
session's total, each as container/host ratio; each job's wall time; the image build cold and the cache hit per
task; every podman call of the warm job's sessions by step (each session's podman-steps.jsonl: `run` split into
start / harness / stop as the container saw them, `up` the container's own start, and how many started ahead of their
session); the machine's load average while each job ran, and the machine's busy CPU seconds per session (all of the
machine's: on a shared one, others' work counts too), as container/host per round: with the CPU saturated (8 sessions
on 2 cores) that, not waiting, is what a container session costs. With several --parallelism values (the images built
once), one block per value. Images the bench built are removed at the end.
Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent / "tests")]

from fixtures.harbor_tasks import TASK_TOML, write_task  # noqa: E402
from runner import start_scripted_engine  # noqa: E402  (bench/runner.py)
from tracefleet.runner.containers.runtime import BASE_IMAGE, STEPS_ENV, STEPS_FILE, require_runtime  # noqa: E402

PROMPT = "Write the word tracefleet to note.txt with the shell, then list the directory."
NOTE_TEST_SH = "#!/bin/bash\nif [ -f /app/note.txt ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
IMAGE_LINE = re.compile(r"task image (\S+): (built|cached) (\S+) \(([0-9.]+) s\)")


def job(name: str, tasks: dict[str, Any], evaluator: dict[str, Any] | None, samples: int, parallelism: int,
        out: Path) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "inference": {"external": {"baseUrl": "http://127.0.0.1:1"}, "capture": {"mode": "server"}},
        "harness": {"preset": "pi", "sessionTimeoutSeconds": 300},
        "tasks": {"samplesPerTask": samples, **tasks}, "parallelism": parallelism,
        "output": {"uri": str(out), "tracesPerBatch": 64}}
    if evaluator:
        spec["evaluator"] = evaluator
    return {"apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": name}, "spec": spec}


@dataclass
class JobRun:
    wall: float
    results: list[dict[str, Any]]  # every session's result.json, with its podman steps
    stderr: str
    loads: list[float]  # the 1-minute load average every 2 s
    cpu_s: float  # the whole machine's busy CPU seconds while it ran (its own and anything else running)


def machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def run_job(body: dict[str, Any], root: Path, engine_url: str) -> JobRun:
    """`tracefleet run` of one job, timed."""
    folder = root / body["metadata"]["name"]
    folder.mkdir()
    (folder / "job.yaml").write_text(yaml.safe_dump(body))
    started, cpu = time.monotonic(), machine_cpu_s()
    proc = subprocess.Popen([sys.executable, "-m", "tracefleet.cli", "run", str(folder / "job.yaml"), "--work-dir",
                             str(folder / "work"), "--engine-url", engine_url], cwd=folder, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, STEPS_ENV: str(folder / STEPS_FILE)})
    loads: list[float] = []
    sampler = threading.Thread(target=lambda: _sample_load(proc, loads), daemon=True)
    sampler.start()
    out, err = proc.communicate()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    wall, cpu = time.monotonic() - started, machine_cpu_s() - cpu
    if done.returncode != 0:
        raise SystemExit(f"{body['metadata']['name']} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    results = []
    for path in sorted((folder / "work" / "sessions").glob("*/*/result.json")):
        result = json.loads(path.read_text())
        steps = [json.loads(line) for f in path.parent.rglob(STEPS_FILE) for line in f.read_text().splitlines()]
        results.append({**result, "podman_steps": steps})
    # calls made outside a session's record (code that times no session): the job's, counted on its first session
    untimed = folder / STEPS_FILE
    if untimed.is_file() and results:
        results[0]["podman_steps"] += [json.loads(line) for line in untimed.read_text().splitlines()]
    return JobRun(wall, results, done.stderr, loads, cpu)


def _sample_load(proc: subprocess.Popen[str], loads: list[float]) -> None:
    while proc.poll() is None:
        loads.append(os.getloadavg()[0])
        time.sleep(2)


def steps_table(results: list[dict[str, Any]]) -> list[str]:
    """Every podman call of these sessions by step: calls per session, median and total seconds; `run` split."""
    by_step: dict[str, list[float]] = {}
    parts: dict[str, list[float]] = {}
    for r in results:
        for step in r["podman_steps"]:
            by_step.setdefault(step["step"], []).append(step["s"])
            for part in ("up", "start", "harness", "stop"):
                if step["step"] == "run" and part in step:
                    parts.setdefault(part, []).append(step[part])
    n = len(results) or 1
    lines = [f"    {name:<16} {len(v) / n:4.1f}/session  median {statistics.median(v):6.3f} s  mean "
             f"{statistics.mean(v):6.3f} s  total {sum(v):7.1f} s" for name, v in sorted(by_step.items())]
    lines += [f"    run: {part:<11} median {statistics.median(v):6.3f} s  mean {statistics.mean(v):6.3f} s"
              for part, v in parts.items()]
    ahead = [step.get("ahead", 0.0) for r in results for step in r["podman_steps"] if step["step"] == "run"]
    if ahead:
        lines.append(f"    run: started ahead of its session {sum(ahead):.0f} of {len(ahead)}")
    return lines


def stage(results: list[dict[str, Any]], name: str) -> list[float]:
    return [r["timings"].get(name, 0.0) for r in results]


def line(label: str, container: list[float], host: list[float]) -> str:
    cm, hm = statistics.median(container), statistics.median(host)
    return (f"  {label:<9} container median {cm:6.2f} s mean {statistics.mean(container):6.2f} s | host median "
            f"{hm:6.2f} s mean {statistics.mean(host):6.2f} s | ratio (median) {cm / hm if hm else float('inf'):5.2f}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--parallelism", type=int, nargs="+", default=[4])
    parser.add_argument("--no-cpu-limit", action="store_true",
                        help="tasks without task.toml's cpus = 1 (the host's sessions have no such cap): what the "
                             "container itself costs, apart from the limit the task asks for")
    parser.add_argument("--no-memory-limit", action="store_true",
                        help="tasks without task.toml's memory_mb = 1024: node sizes its heap by the cgroup's memory "
                             "limit (a 1 GiB limit gives a 0.5 GiB heap, so more collections than on the host)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="warm and host jobs per parallelism, in turn (host first every other round): on a shared "
                             "machine both then see the same load")
    args = parser.parse_args()
    runtime = require_runtime()
    nonce = uuid.uuid4().hex[:8]
    engine, url = start_scripted_engine()
    images: list[str] = []
    blocks: list[tuple[int, dict[str, list[JobRun]], dict[str, list[tuple[str, ...]]]]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-containers-") as tmp:
            root = Path(tmp)
            ids = [f"bench-{nonce}-{i:02d}" for i in range(args.tasks)]
            for task_id in ids:
                toml = TASK_TOML.format(verifier_timeout=120)
                toml = toml.replace("cpus = 1\n", "") if args.no_cpu_limit else toml
                toml = toml.replace("memory_mb = 1024\n", "") if args.no_memory_limit else toml
                write_task(root / "tasks", task_id, instruction=PROMPT + "\n", toml=toml,
                           dockerfile=f"FROM {BASE_IMAGE}\nRUN echo {task_id} > /etc/bench-task\nWORKDIR /app\n",
                           env_files={}, test_sh=NOTE_TEST_SH, test_files={}, solve_sh=None)
            harbor = {"harbor": {"uri": str(root / "tasks")}}
            inline = {"inline": [{"id": t, "prompt": PROMPT} for t in ids]}  # an empty workspace, as /app is
            for i, parallelism in enumerate(args.parallelism):
                runs: dict[str, list[JobRun]] = {}
                jobs = [("harbor-cold", harbor, None)] if i == 0 else []
                pair = [("harbor-warm", harbor, None),
                        ("host", inline, {"preset": "command", "command": ["sh", "-c", "test -f note.txt"]})]
                for r in range(args.rounds):
                    jobs += pair if r % 2 == 0 else pair[::-1]
                for k, (name, tasks, evaluator) in enumerate(jobs):
                    runs.setdefault(name, []).append(run_job(job(f"bench-{name}-p{parallelism}-{k}", tasks, evaluator,
                                                                 args.samples, parallelism, root / "out"), root, url))
                builds = {name: [m.groups() for m in IMAGE_LINE.finditer(runs[name][0].stderr)] for name in runs
                          if name.startswith("harbor")}
                images = sorted({image for _, _, image, _ in builds.get("harbor-cold", [])}) or images
                blocks.append((parallelism, runs, builds))
    finally:
        engine.terminate()
        engine.wait(timeout=30)
        if images:
            runtime.run("rmi", "-f", *images, check=False, timeout=300)
    n = args.tasks * args.samples
    for parallelism, runs, builds in blocks:
        print(f"{args.tasks} tasks x {args.samples} samples = {n} sessions per job, parallelism {parallelism}, Pi, "
              f"scripted engine, {os.cpu_count()} cores")
        for name, rounds in runs.items():
            for run in rounds:
                statuses = sorted({(r["status"], r["reward"]) for r in run.results})
                load = f"load {statistics.mean(run.loads):4.1f} (max {max(run.loads):4.1f})" if run.loads else "load -"
                print(f"  job {name:<12} wall {run.wall:6.1f} s ({n / run.wall * 60:5.1f} sessions/min), "
                      f"machine CPU {run.cpu_s / n:5.2f} s/session, {load}; (status, reward): {statuses}")
        container = [r for run in runs["harbor-warm"] for r in run.results]
        host = [r for run in runs["host"] for r in run.results]
        print(f"  per session, harbor warm (images cached) vs host ({len(runs['host'])} round(s), sessions pooled):")
        for label in ("harness", "collect", "evaluate", "total"):
            print("  " + line(label, stage(container, label), stage(host, label)))
        if len(runs["host"]) > 1:
            ratios = [statistics.median(stage(c.results, "total")) / statistics.median(stage(h.results, "total"))
                      for c, h in zip(runs["harbor-warm"], runs["host"])]
            print("    total ratio per round (median/median): " + " ".join(f"{x:.2f}" for x in ratios))
        cpu = [c.cpu_s / h.cpu_s for c, h in zip(runs["harbor-warm"], runs["host"])]
        print("    machine CPU per round (container job / host job): " + " ".join(f"{x:.2f}" for x in cpu))
        print("  podman calls of the warm job's sessions, by step:")
        print("\n".join(steps_table(container)))
        for name, rows in builds.items():
            seconds = [float(s) for *_, s in rows]
            kinds = sorted({kind for _, kind, _, _ in rows})
            if seconds:
                print(f"  images {name:<12} {kinds}: {len(seconds)} tasks, median {statistics.median(seconds):.2f} s, "
                      f"total {sum(seconds):.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
