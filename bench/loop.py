"""Bench: does reward rise under the loop? `tracefleet train` (tracefleet.trainer.loop) over several seeds.

    .venv/bin/python bench/loop.py [--seeds 0 1 2] [--minutes 30] [--lr 1e-4] [--epochs 2] [--train-layers 4]
                                   [--job examples/loop/job.yaml] [--held-out examples/loop/held-out.yaml]
                                   [--vllm-url URL] [--out DIR]

One real vLLM (CPU build, SmolLM2-135M-Instruct; needs hack/setup.d/45-vllm.sh) is started (or --vllm-url
names one started the same way) and each seed runs the whole loop on it in turn, from the base weights (the
loop puts them back as policy 0 first): the job's sessions produced continuously by the local driver, the
reference GRPO trainer reading the sealed batches, its weights synced into the engine after every step.
Per seed and over the seeds: steps and wall time, the mean batch reward over the first two steps and over the
last two, the held-out tasks' reward at policy 0 and after the last step (never trained on), the
train/inference mismatch per step, weight-sync seconds per step, and calls/tokens aborted by syncs.

The seed sets torch's seed; sampling is vLLM's own (unseeded), so seeds differ mostly by what was sampled.
Every figure is measured; the JSON of each seed's steps is in OUT/seed-N/loop.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tracefleet.engine.vllm_local import launch
from tracefleet.trainer.loop import DEFAULT_EPOCHS, DEFAULT_LR, DEFAULT_TRAIN_LAYERS, LoopOptions, LoopResult, fmt, run_loop

REPO = Path(__file__).resolve().parents[1]


def seed_row(seed: int, r: LoopResult) -> dict[str, object]:
    first, last = r.reward_rise()
    syncs = [s["sync_s"] for s in r.steps]
    mism = [s["mean_abs_dlogprob"] for s in r.steps if s.get("mean_abs_dlogprob") is not None]
    return {"seed": seed, "steps": len(r.steps), "wall_min": round(r.wall_s / 60, 1), "sessions": r.sessions,
            "first2": first, "last2": last, "rise": None if first is None or last is None else last - first,
            "held_out_before": r.held_out_before, "held_out_after": r.held_out_after,
            "mismatch_mean": statistics.fmean(mism) if mism else None,
            "mismatch_max": max((s.get("max_abs_dlogprob") or 0.0) for s in r.steps) if r.steps else None,
            "sync_mean_s": statistics.fmean(syncs) if syncs else None, "sync_max_s": max(syncs) if syncs else None,
            "train_mean_s": statistics.fmean(s["train_s"] for s in r.steps) if r.steps else None,
            "calls_aborted": r.calls_aborted, "tokens_aborted": r.tokens_aborted,
            "stale_tokens_masked": sum(s["stale_tokens_masked"] for s in r.steps) + sum(b["stale_tokens_masked"] for b in r.skipped),
            "batches_skipped": len(r.skipped), "generation_holds": r.steps[-1].get("holds", 0) if r.steps else 0,
            "rewards": [s["reward_mean"] for s in r.steps]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--minutes", type=float, default=30.0, help="per seed")
    p.add_argument("--iterations", type=int, default=1000, help="per seed (the time budget usually ends it)")
    p.add_argument("--lr", type=float, default=DEFAULT_LR)
    p.add_argument("--train-layers", type=int, default=DEFAULT_TRAIN_LAYERS)
    p.add_argument("--max-lag", type=int, default=1)
    p.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    p.add_argument("--traces-per-step", type=int)
    p.add_argument("--job", type=Path, default=REPO / "examples" / "loop" / "job.yaml")
    p.add_argument("--held-out", type=Path, default=REPO / "examples" / "loop" / "held-out.yaml")
    p.add_argument("--vllm-url")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="tf-bench-loop-"))
    engine = None
    url = a.vllm_url
    t0 = time.monotonic()
    if url is None:
        engine = launch(log=out / "vllm.log")
        url = engine.url
        print(f"vLLM up in {time.monotonic() - t0:.0f} s at {url}", flush=True)
    rows = []
    try:
        for seed in a.seeds:
            print(f"--- seed {seed}: {a.minutes:g} min, lr {a.lr:g}, top {a.train_layers} layers, {a.epochs} epoch(s)", flush=True)
            r = run_loop(LoopOptions(job_path=a.job, iterations=a.iterations, minutes=a.minutes, lr=a.lr,
                                     max_lag=a.max_lag, seed=seed, traces_per_step=a.traces_per_step,
                                     output=out / f"seed-{seed}", engine_url=url, held_out=[a.held_out] if a.held_out else [],
                                     train_layers=a.train_layers or None, epochs=a.epochs))
            rows.append(seed_row(seed, r))
            print(json.dumps(rows[-1]), flush=True)
            (out / "bench.json").write_text(json.dumps(rows, indent=1))
    finally:
        if engine is not None:
            engine.stop()
    print(f"\nseed  steps  wall  first2  last2   rise  held-out 0 -> end  |dlp| mean/max   sync mean/max s  aborted calls/tokens")
    for r in rows:
        print(f"{r['seed']:>4}  {r['steps']:>5}  {r['wall_min']:>4}  {fmt(r['first2']):>6}  {fmt(r['last2']):>5}  "
              f"{fmt(r['rise']):>5}  {fmt(r['held_out_before']):>6} -> {fmt(r['held_out_after']):<6}  "
              f"{fmt(r['mismatch_mean'], 5)}/{fmt(r['mismatch_max'], 4)}  {fmt(r['sync_mean_s'])}/{fmt(r['sync_max_s'])}  "
              f"{r['calls_aborted']}/{r['tokens_aborted']}")
    rises = [r["rise"] for r in rows if r["rise"] is not None]
    if rises:
        print(f"mean rise over {len(rises)} seeds: {statistics.fmean(rises):+.2f} (goal +0.30); results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
