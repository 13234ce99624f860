"""`tracefleet train JOB.yaml`: the whole loop on this machine (tracefleet.trainer.loop)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tracefleet.bucket import uri_scheme
from tracefleet.trainer.loop import (
    ADVANTAGES,
    DEFAULT_EPOCHS,
    DEFAULT_LR,
    DEFAULT_SCHEDULE,
    DEFAULT_TRAIN_LAYERS,
    DEFAULT_WARM_LAYERS,
    DEFAULT_WARM_EPOCHS,
    DEFAULT_WARM_LR,
    DEFAULT_WARM_SCHEDULE,
    FLAT_GROUPS,
    SCHEDULES,
    TRAINER_THREADS,
    WARM_SCHEDULES,
    warm_layers_option,
)
from tracefleet.trainer.step_size import KL_STOP, LR_FACTOR, LR_RANGE
from tracefleet.trainer.task_sampler import DEFAULT_EXPLORE, TASK_SAMPLINGS
from tracefleet.usage import UsageError, positive_int

EPILOG = """\
examples:
  tracefleet train examples/loop/job.yaml --iterations 10
      start vLLM (CPU) with SmolLM2, run the job's sessions continuously, train with GRPO, sync the weights
      into the engine after every step; one line per step
  tracefleet train examples/loop/job.yaml --minutes 30 --held-out examples/loop/held-out.yaml
      a time budget, and the held-out tasks scored before the first update and after the last
  tracefleet train examples/harness-train/job.yaml --demos 32 --held-out examples/harness-train/held-out.yaml
      through a real harness (Pi): 32 demonstrations recorded through Pi first (the scripted engine playing a
      correct agent in Pi's tool protocol), a supervised warm start on their tokens, then GRPO on Pi sessions;
      the held-out tasks scored at policy 0, after the warm start and after the last step
  tracefleet train examples/harness-train/job.yaml --demos 64 --held-out examples/harness-train/held-out.yaml \
      --held-out examples/harness-train/held-out-novel.yaml --task-sampling spread --group-size 2
      two held-out sets scored side by side (the second worded unlike the generator, with task shapes it never
      makes); the rollouts' tasks drawn where a group can have reward spread, in groups of 2
  tracefleet train job.yaml --engine-url http://127.0.0.1:8000
      use a vLLM already started by `tracefleet engine --backend vllm` (reset to its base weights first)

Needs the vLLM CPU build (`bash hack/setup.d/45-vllm.sh`) and torch (`pip install -e '.[trainer]'`).
Output: one line per step on stdout (batch reward, groups with signal, loss, train/inference mismatch,
weight-sync seconds, requests kept/aborted by the sync, stale tokens masked), then a summary; progress on
stderr; every step as JSON in RUN/loop.jsonl. Exit status: 0 done, 1 failed (nothing trained: no step and no
warm start), 2 usage error, 130 interrupted.
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("job", type=Path, metavar="JOB.yaml", help="a RolloutJob serving a shipped model (smollm2)")
    parser.add_argument("--iterations", "-n", type=positive_int, default=20, metavar="N", help="training steps (default 20)")
    parser.add_argument("--minutes", type=float, metavar="M", help="stop after this long, whatever the step count")
    parser.add_argument("--lr", type=float, default=DEFAULT_LR, help=f"AdamW learning rate (default {DEFAULT_LR:g})")
    parser.add_argument("--max-lag", type=int, default=1, metavar="K",
                        help="staleness bound: tokens more than K versions old are masked out (default 1)")
    parser.add_argument("--traces-per-step", type=positive_int, metavar="N",
                        help="traces per batch, so per step (default: the job's output.tracesPerBatch)")
    parser.add_argument("--held-out", type=Path, metavar="JOB.yaml", action="append", default=[],
                        help="a job whose tasks are scored before the first and after the last update (not trained "
                             "on); repeat it to score several sets side by side")
    parser.add_argument("--output", "-o", type=Path, metavar="DIR",
                        help="the run's folder (default ./tracefleet-output/JOB-train-TIME)")
    parser.add_argument("--engine-url", metavar="URL", help="a running vLLM started like `tracefleet engine --backend vllm`")
    parser.add_argument("--parallelism", "-j", type=positive_int, metavar="N", help="sessions at once (default: spec.parallelism)")
    parser.add_argument("--seed", type=int, default=0, help="torch seed (sampling is the engine's)")
    parser.add_argument("--train-layers", type=int, default=DEFAULT_TRAIN_LAYERS, metavar="N",
                        help=f"train the top N decoder layers (default {DEFAULT_TRAIN_LAYERS}; 0: every layer)")
    parser.add_argument("--epochs", type=positive_int, default=DEFAULT_EPOCHS, metavar="N",
                        help=f"optimizer updates per batch, the PPO clip bounding them (default {DEFAULT_EPOCHS})")
    warm = parser.add_mutually_exclusive_group()
    warm.add_argument("--demos", type=positive_int, metavar="N",
                      help="record N demonstrations of the job's first tasks through its harness (generated tasks: "
                           "python -m tracefleet.trainer.filetasks), then warm-start on them before GRPO")
    warm.add_argument("--warm-start", type=Path, metavar="DIR",
                      help="warm-start on demonstrations recorded before (python -m tracefleet.trainer.demos)")
    parser.add_argument("--warm-epochs", type=positive_int, default=DEFAULT_WARM_EPOCHS, metavar="N",
                        help=f"passes over the demonstrations (default {DEFAULT_WARM_EPOCHS})")
    parser.add_argument("--warm-layers", type=int, metavar="N",
                        help=f"the warm start trains the top N decoder layers (default {DEFAULT_WARM_LAYERS}; 0: every layer), "
                             "GRPO's steps then the top --train-layers")
    parser.add_argument("--warm-lr", type=float, default=DEFAULT_WARM_LR,
                        help=f"the warm start's AdamW learning rate (default {DEFAULT_WARM_LR:g})")
    parser.add_argument("--warm-schedule", choices=WARM_SCHEDULES,
                        help=f"the warm start's learning rate over its updates: constant, or linear (decayed to 0 by "
                             f"the last update) (default {DEFAULT_WARM_SCHEDULE})")
    parser.add_argument("--score-limit", type=positive_int, metavar="N",
                        help="score at most N tasks of the held-out job (and of --score-train)")
    parser.add_argument("--score-train", type=int, default=0, metavar="N",
                        help="also score the job's last N tasks (one sample each) before, after the warm start and after")
    parser.add_argument("--skip-base-score", action="store_true",
                        help="do not score the held-out sets (and --score-train) at policy 0: the base weights, the "
                             "same in every run of the model (scored once, by an earlier run)")
    parser.add_argument("--train-flat", action="store_true",
                        help="also update on a batch in which no group has reward spread (default: skip it, its "
                             "gradient is zero)")
    parser.add_argument("--task-sampling", choices=TASK_SAMPLINGS, default="rounds",
                        help="which task the rollouts run next: rounds (every task in turn; default) or spread "
                             "(drawn by the chance its group has reward spread, from the pass rates so far)")
    parser.add_argument("--explore", type=float, metavar="F",
                        help=f"with --task-sampling spread: at least this share of the groups goes to the task kinds "
                             f"evenly, so none starves (default {DEFAULT_EXPLORE:g})")
    parser.add_argument("--group-size", type=int, metavar="N",
                        help="sessions per task in a GRPO group (default: the job's samplesPerTask)")
    parser.add_argument("--advantage", choices=ADVANTAGES, default="grpo",
                        help="grpo: (r - mean) / std in the group (default); dr-grpo: r - mean, not divided by the std; "
                             "positive: grpo's, the negative ones set to 0")
    parser.add_argument("--flat-groups", choices=FLAT_GROUPS, default="keep",
                        help="a group with no reward spread: keep it counted in the loss's token mean (default) or "
                             "drop it, the loss the mean over the groups with spread")
    parser.add_argument("--kl", type=float, default=0.0, metavar="BETA",
                        help="add BETA times the KL divergence from the policy GRPO starts from (the warm start's) to "
                             "the loss, over the trained tokens (default 0: none)")
    parser.add_argument("--target-kl", type=float, default=0.0, metavar="K",
                        help=f"adapt the learning rate to each step's KL from the policy before it: {LR_FACTOR:g}x "
                             f"lower after a step above 2K, {LR_FACTOR:g}x higher after one below K/2, within "
                             f"{LR_RANGE:g}x of --lr; a step's next pass is not taken above {KL_STOP:g}K (default 0: "
                             "the rate fixed at --lr)")
    parser.add_argument("--demo-mix", type=float, default=0.0, metavar="COEF",
                        help="each GRPO update also minimises COEF times the NLL of the warm start's demonstrations, "
                             "one of every kind in turn, in a term of their own (PPO-ptx; needs --demos or "
                             "--warm-start; default 0: none)")
    parser.add_argument("--guide", type=float, default=0.0, metavar="BELOW",
                        help="guided prefixes: a group of a task the rollouts solve less than BELOW of the time has its "
                             "first tool calls (all but the last) answered by the task's demonstration, as context "
                             "never trained on, fewer as its pass rate rises (default 0: none)")
    parser.add_argument("--schedule", choices=SCHEDULES, default=DEFAULT_SCHEDULE,
                        help="overlap: the rollouts sample while a GRPO step trains, the trainer on one thread "
                             "(default); alternate: the engine is paused (keep) for each step, which trains on every core")
    parser.add_argument("--torch-threads", type=positive_int, metavar="N",
                        help=f"CPU threads for the trainer (default: every core for the warm start and for alternate "
                             f"steps; {TRAINER_THREADS} for overlap steps, vLLM's CPU build holding the other cores)")


def main(args: argparse.Namespace) -> int:
    from tracefleet.trainer.loop import LoopOptions, run_loop

    if args.train_layers < 0:
        raise UsageError("--train-layers must be 0 (every layer) or more")
    if args.warm_layers is not None and args.warm_layers < 0:
        raise UsageError("--warm-layers must be 0 (every layer) or more")
    for flag, value in (("--warm-layers", args.warm_layers), ("--warm-schedule", args.warm_schedule)):
        if value is not None and not (args.demos or args.warm_start):
            raise UsageError(f"{flag} applies to a warm start: give --demos or --warm-start")
    if args.max_lag < 0:
        raise UsageError("--max-lag must be 0 or more")
    if args.warm_start is not None and not args.warm_start.is_dir():
        raise UsageError(f"--warm-start {args.warm_start}: no such folder")
    if args.minutes is not None and args.minutes <= 0:
        raise UsageError("--minutes must be more than 0")
    if args.explore is not None and args.task_sampling != "spread":
        raise UsageError("--explore applies to --task-sampling spread only")
    if args.output is not None and uri_scheme(args.output) is not None:
        raise UsageError(f"--output {args.output}: the run's folder on this machine, not a bucket URI (the loop trains "
                         "from the batches it seals there)")
    options = LoopOptions(job_path=args.job, iterations=args.iterations, minutes=args.minutes, lr=args.lr,
                          max_lag=args.max_lag, seed=args.seed, traces_per_step=args.traces_per_step,
                          output=args.output, engine_url=args.engine_url, held_out=args.held_out,
                          parallelism=args.parallelism, torch_threads=args.torch_threads,
                          train_layers=args.train_layers or None, epochs=args.epochs, demos=args.demos,
                          warm_start=args.warm_start, warm_epochs=args.warm_epochs, warm_lr=args.warm_lr,
                          warm_layers=warm_layers_option(args.warm_layers),
                          warm_schedule=args.warm_schedule or DEFAULT_WARM_SCHEDULE,
                          score_limit=args.score_limit, score_train=max(0, args.score_train),
                          score_base=not args.skip_base_score,
                          train_flat=args.train_flat, task_sampling=args.task_sampling,
                          explore=DEFAULT_EXPLORE if args.explore is None else args.explore,
                          group_size=args.group_size, advantage=args.advantage, flat_groups=args.flat_groups,
                          kl=args.kl, target_kl=args.target_kl, demo_mix=args.demo_mix,
                          guide=args.guide, schedule=args.schedule)
    result = run_loop(options)
    # a warm start is an update too: a run whose GRPO batches all lacked reward spread still trained
    return 0 if result.steps or result.warm else 1
