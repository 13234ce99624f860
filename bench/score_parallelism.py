"""Bench: how many sessions at once score a checkpoint through a real harness fastest on this machine.

    .venv/bin/python bench/score_parallelism.py --weights RUN/checkpoints/policy-1 [--parallelism 2 4 8]
        [--held-out examples/harness-train/held-out.yaml examples/harness-train/held-out-novel.yaml]
        [--limit 24] [--job examples/harness-train/job.yaml] [--vllm-url URL] [--out DIR]

Scoring is most of the recipe's minutes (docs/training/real-harness.md: 27.7 of 61.6 on seed 0, the two sets scored
twice), and each scoring runs the held-out job's sessions `spec.parallelism` at a time (2 in the example). One real
vLLM (CPU build, started with the job's extraArgs, or `--vllm-url`) gets the checkpoint's weights as policy 1 (the
in-place reload the loop uses; `A+B` loads B over A, as the engine holds a GRPO checkpoint over its warm start);
then each held-out set is scored once per `--parallelism`, in turn on the same weights, through the job's harness
(Pi). Printed per set and parallelism: sessions, wall seconds, seconds per session, the mean reward with its
standard error, and the speed-up over the first parallelism (a ratio from one run, so the machine's load moves
both sides alike). The reward should not move beyond its error: more sessions at once change only how long each
waits for the engine, and a session that runs past the harness's timeout scores 0, which the reward would show.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tracefleet.api.manifest import load_job
from tracefleet.engine.vllm_local import launch
from tracefleet.trainer.control import update_policy
from tracefleet.trainer.loop import held_out_name, score_held_out
from tracefleet.trainer.scores import line, mean_se

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness_loop import EXAMPLE, load  # noqa: E402  (bench/harness_loop.py: the example's folder, the load averages)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", required=True, help="a checkpoint folder, or A+B (B loaded over A)")
    p.add_argument("--parallelism", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--held-out", type=Path, nargs="+",
                   default=[EXAMPLE / "held-out.yaml", EXAMPLE / "held-out-novel.yaml"])
    p.add_argument("--limit", type=int, help="score the first N tasks of each set (default: all)")
    p.add_argument("--job", type=Path, default=EXAMPLE / "job.yaml", help="the engine's arguments come from it")
    p.add_argument("--vllm-url")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="tf-bench-score-"))
    out.mkdir(parents=True, exist_ok=True)
    engine, url = None, a.vllm_url
    if url is None:
        t0 = time.monotonic()
        engine = launch(log=out / "vllm.log", extra_args=list(load_job(a.job).spec.inference.managed.extra_args or []))
        url = engine.url
        print(f"vLLM up in {time.monotonic() - t0:.0f} s at {url}", flush=True)
    rows = []
    try:
        for version, weights in enumerate(a.weights.split("+"), start=1):
            update_policy([url], weights, version)
        for path in a.held_out:
            name = held_out_name(path, a.held_out)
            for parallelism in a.parallelism:
                load_before = load()
                t0 = time.monotonic()
                results = score_held_out(path, url, out, f"{name}-p{parallelism}", parallelism, a.limit)
                seconds = time.monotonic() - t0
                mean, se = mean_se([r.reward for r in results])
                rows.append({"set": name, "parallelism": parallelism, "sessions": len(results),
                             "seconds": round(seconds, 1), "mean": mean, "se": se, "load_before": load_before})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        if engine is not None:
            engine.stop()
    (out / "bench.json").write_text(json.dumps(rows, indent=1))
    print(f"\nweights {a.weights}; results in {out}")
    print("set                            parallelism  sessions  seconds  s/session  reward        speed-up")
    for r in rows:
        first = next(x for x in rows if x["set"] == r["set"])
        per = r["seconds"] / max(1, r["sessions"])
        speed = (first["seconds"] / max(1, first["sessions"])) / per if per else float("nan")
        print(f"{r['set']:<30} {r['parallelism']:>11}  {r['sessions']:>8}  {r['seconds']:>7.0f}  {per:>9.1f}  "
              f"{line((r['mean'], r['se'], r['sessions'])):<12}  {speed:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
