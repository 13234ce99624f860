"""Bench: how fast the warm start trains on 1 thread and on every core, with nothing else running.

    .venv/bin/python bench/trainer_threads.py [--demos 16] [--threads 1 2] [--repeats 2] [--warm-layers 12]
        [--job examples/harness-train/job.yaml] [--out DIR]

`tracefleet train` keeps its trainer to one torch thread while the rollouts run beside it (vLLM's CPU build binds
its OpenMP threads to the other cores: trainer/loop.py, TRAINER_THREADS), and takes every core when it has the
machine to itself: the warm start (the demonstrations are recorded first and the engine is idle) and, with
`--schedule alternate`, each GRPO step (the engine paused). This bench records `--demos` demonstrations through
the job's harness (Pi, the scripted engine; kept in `--out` for the next run), then trains one warm-start epoch over
them from the base weights at each `--threads`, `--repeats` times in turn, and prints the seconds, the NLL (the
same at every thread count: only float reductions are ordered differently) and each thread count's speed-up over
the first (a ratio from one run: the machine's load moves both sides alike).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from tracefleet.api.manifest import load_job
from tracefleet.engine.vllm_local import converted_model
from tracefleet.trainer import demos
from tracefleet.trainer.grpo import load_policy, sft, trainable
from tracefleet.trainer.jobs import trained_model
from tracefleet.trainer.loop import DEFAULT_WARM_LAYERS, DEFAULT_WARM_LR

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness_loop import EXAMPLE, load  # noqa: E402  (bench/harness_loop.py: the example's folder, the load averages)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demos", type=int, default=16)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--warm-layers", type=int, default=DEFAULT_WARM_LAYERS)
    p.add_argument("--job", type=Path, default=EXAMPLE / "job.yaml")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="tf-bench-threads-"))
    print(f"machine load: {load()}", flush=True)
    if not (out / "batches").is_dir():
        demos.record(a.job, out, a.demos, parallelism=2)
    t = demos.tensors(demos.rewarded(demos.find(out)))
    print(f"{int(t['input_ids'].shape[0])} demonstrations, {int(t['loss_mask'].sum())} sampled tokens; one warm-start "
          f"epoch on the top {a.warm_layers} layers", flush=True)
    model_dir = converted_model(trained_model(load_job(a.job)))  # the weights the loop trains for --job
    seconds: dict[int, list[float]] = {n: [] for n in a.threads}
    for _ in range(a.repeats):
        for n in a.threads:
            torch.set_num_threads(n)
            policy = load_policy(model_dir, a.warm_layers)
            t0 = time.monotonic()
            stats = sft(policy, torch.optim.AdamW(trainable(policy), lr=DEFAULT_WARM_LR), t, epochs=1, decay=True)
            seconds[n].append(time.monotonic() - t0)
            print(f"  {n} thread(s): {seconds[n][-1]:.1f} s, NLL {stats['nll'][0]:.6f}", flush=True)
    first = statistics.fmean(seconds[a.threads[0]])
    for n in a.threads:
        mean = statistics.fmean(seconds[n])
        print(f"{n} thread(s): {mean:.1f} s mean of {a.repeats}, {first / mean:.2f}x the speed of {a.threads[0]}")
    print(f"machine load: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
