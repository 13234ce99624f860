"""Bench: the trainer's pass over rows that share a harness's system prompt, run whole per row against the shared
prompt run once through the trained layers (tracefleet.trainer.grpo.sampled_logprobs), side by side as ratios.

    .venv/bin/python bench/trainer_prefix.py --rows RUN/demos --model BASE [--rows-per-pass 2 8] [--layers 12 4]
        [--threads 1] [--repeats 2]

`--rows`: a folder of sealed batches (a `tracefleet train` run's `demos` or `batches`); the first rows of each pass
size are taken in task order. For each trained-layer count and pass size it times one forward and backward pass
(what a warm-start update and a GRPO step's epoch cost; the frozen layers' hidden states are computed before the
clock starts, as a step computes them once for all its passes) both ways, best of `--repeats`, and prints the
seconds, their ratio, and how far the two passes' logprobs and gradients are apart.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

WHOLE = 10**9  # a shared prompt shorter than this runs per row: every row whole


def timed_pass(policy: Any, rows: dict[str, Any], prefix: Any, least: int, repeats: int) -> tuple[float, Any, Any]:
    """Best seconds of one forward and backward pass over `rows` with grpo's sharing threshold at `least`, and the
    last pass's logprobs and flattened gradient."""
    import torch

    from tracefleet.trainer import grpo

    kept, grpo.SHARED_MIN_TOKENS = grpo.SHARED_MIN_TOKENS, least
    best = float("inf")
    try:
        for _ in range(repeats):
            policy.zero_grad()
            start = time.perf_counter()
            lp = grpo.sampled_logprobs(policy, rows["input_ids"], rows["attention_mask"], rows["loss_mask"], 1.0, prefix)
            (-(lp * rows["loss_mask"]).sum()).backward()
            best = min(best, time.perf_counter() - start)
    finally:
        grpo.SHARED_MIN_TOKENS = kept
    return best, lp.detach(), torch.cat([p.grad.flatten() for p in grpo.trainable(policy)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=Path, required=True, help="a folder of sealed batches (a run's demos or batches)")
    p.add_argument("--model", type=Path, required=True, help="the base model's Hugging Face folder")
    p.add_argument("--rows-per-pass", type=int, nargs="+", default=[2, 8])
    p.add_argument("--layers", type=int, nargs="+", default=[12, 4], help="trained top layers (the warm start's, GRPO's)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the loop's trainer uses 1)")
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args(argv)

    import torch

    from tracefleet.trainer import demos, grpo

    torch.set_num_threads(a.threads)
    t = demos.tensors(demos.rewarded(demos.find(a.rows)))
    print(f"{int(t['input_ids'].shape[0])} rows from {a.rows}; torch threads {a.threads}", flush=True)
    print(f"{'layers':>6} {'rows':>4} {'shared':>6} {'tokens':>6} {'whole s':>8} {'shared s':>8} {'ratio':>6} "
          f"{'max |dlp|':>9} {'grad rel':>8}", flush=True)
    for layers in a.layers:
        policy = grpo.load_policy(a.model, layers)
        for n in a.rows_per_pass:
            rows = {k: t[k][:n] for k in ("input_ids", "attention_mask", "loss_mask")}
            length = int(rows["attention_mask"].sum(1).max())
            rows = {k: v[:, :length] for k, v in rows.items()}
            with torch.no_grad():
                prefix = grpo.frozen_prefix(policy, rows["input_ids"], rows["attention_mask"])
            whole, lp_whole, g_whole = timed_pass(policy, rows, prefix, WHOLE, a.repeats)
            shared, lp_shared, g_shared = timed_pass(policy, rows, prefix, grpo.SHARED_MIN_TOKENS, a.repeats)
            line = {"layers": layers, "rows": n, "shared_tokens": grpo.shared_tokens(rows["input_ids"], rows["attention_mask"]),
                    "tokens": int(rows["attention_mask"].sum()), "whole_s": round(whole, 2), "shared_s": round(shared, 2),
                    "ratio": round(whole / shared, 2), "max_abs_dlogprob": float((lp_whole - lp_shared).abs().max()),
                    "grad_rel": float((g_whole - g_shared).norm() / g_whole.norm())}
            print(f"{layers:>6} {n:>4} {line['shared_tokens']:>6} {line['tokens']:>6} {whole:>8.2f} {shared:>8.2f} "
                  f"{line['ratio']:>6.2f} {line['max_abs_dlogprob']:>9.1e} {line['grad_rel']:>8.1e}", flush=True)
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
