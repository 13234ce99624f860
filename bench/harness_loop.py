"""Bench: training through a real harness (Pi) with `tracefleet train`, the whole recipe over seeds.

    .venv/bin/python bench/harness_loop.py [--seeds 0 1 2] [--minutes 20] [--demos 64] [--warm-epochs 3]
        [--warm-schedule linear] [--score-limit 60] [--score-train 24] [--base-sample 8] [--base-models gemma3-270m]
        [--base-presets codex] [--base-context 8192] [--train-flat] [--task-sampling spread] [--explore 0.25]
        [--group-size 2] [--advantage dr-grpo] [--flat-groups drop] [--kl 0.05] [--target-kl 0.02]
        [--demo-mix 1] [--guide 0.3]
        [--job examples/harness-train/job.yaml]
        [--held-out examples/harness-train/held-out.yaml examples/harness-train/held-out-novel.yaml]
        [--skip-base-score] [--rows EARLIER/bench.json] [--vllm-url URL] [--out DIR]

First, before anything is trained, the base rate of shipped models on the held-out tasks at the loop's sampling
settings (the job's spec.inference.sampling: temperature 1 in the example), `--base-sample` held-out tasks, one
session each: through the job's harness for each of `--base-models` on the CPU engine (`tracefleet run`'s own;
SmolLM2's is the first seed's policy-0 score on vLLM), and SmolLM2 through each of `--base-presets` (a second CLI)
on a vLLM started with the job's arguments but a context of `--base-context` tokens (Codex's first prompt is ~6.6k
tokens; the loop's 2,560 holds Pi's 1.5k), for the base rate only.

Then per seed, on one real vLLM (CPU build, SmolLM2-135M-Instruct, started with the job's extraArgs, or
`--vllm-url`), `tracefleet train JOB --demos N --held-out HELD --score-train M` from the base weights: N
demonstrations recorded through the real CLI (the scripted engine playing a correct agent in the harness's own tool
protocol, exact mode), the supervised warm start on their sampled tokens, GRPO on the policy's own sessions for
`--minutes`; the held-out tasks and M of the job's own tasks scored at policy 0, after the warm start and after RL.
Printed per seed: base / warm start / RL on train and on each held-out set (the generator's, and the second set
worded unlike it with task shapes it never makes), each with its standard error, and RL's gain over the warm start
paired over the same sessions; steps, flat batches skipped, minutes (the recipe's: first demonstration to last
score, vLLM's start and the policy-0 scoring excluded; and the whole seed's), syncs and their seconds, the
train/inference mismatch. Then the mean of the seeds. Everything measured; each seed's steps are in
OUT/seed-N/loop.jsonl, its scores per session in OUT/bench.json. `--skip-base-score` leaves policy 0 unscored (the
base weights score alike whatever the seed: about 20 minutes saved per seed); `--rows` prints an earlier run's seeds
beside this run's, so seeds run apart make one table and one mean.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tracefleet.engine.vllm_local import launch
from tracefleet.trainer.loop import (
    DEFAULT_EPOCHS,
    DEFAULT_LR,
    DEFAULT_SCHEDULE,
    DEFAULT_TRAIN_LAYERS,
    DEFAULT_WARM_LAYERS,
    DEFAULT_WARM_EPOCHS,
    DEFAULT_WARM_LR,
    DEFAULT_WARM_SCHEDULE,
    LoopOptions,
    LoopResult,
    ADVANTAGES,
    FLAT_GROUPS,
    SCHEDULES,
    WARM_SCHEDULES,
    fmt,
    layers_text,
    run_loop,
    warm_layers_option,
)
from tracefleet.trainer.scores import CHECKPOINTS, SetScores, line, mean_se, paired_gain
from tracefleet.trainer.task_sampler import DEFAULT_EXPLORE, TASK_SAMPLINGS

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "harness-train"


def load() -> str:
    """The machine's load averages (1, 5, 15 min): the numbers are only comparable at a like load."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def with_context(args: list[str], context: int | None) -> list[str]:
    """Engine arguments with `--max-model-len context` in place of the job's."""
    args = list(args)
    if context is not None:
        if "--max-model-len" in args:
            args[args.index("--max-model-len") + 1] = str(context)
        else:
            args += ["--max-model-len", str(context)]
    return args


def base_rate(held_out: Path, model: str, sample: int, out: Path, preset: str | None = None,
              engine_url: str | None = None) -> tuple[float | None, int]:
    """The held-out job's first `sample` tasks, one session each, on `model` served by `tracefleet run`'s own
    CPU engine (llama.cpp, its default temperature 1) or the vLLM at `engine_url`; through `preset` instead of the
    job's harness when given."""
    from tracefleet.api.manifest import load_job
    from tracefleet.runner.local import LocalOptions, LocalRun
    from tracefleet.trainer.loop import job_tasks, with_tasks

    job = load_job(held_out)
    managed = job.spec.inference.managed.model_copy(update={"model": model})
    spec = job.spec.model_copy(update={"inference": job.spec.inference.model_copy(update={"managed": managed})})
    if preset is not None:
        spec = spec.model_copy(update={"harness": spec.harness.model_copy(update={"preset": preset})})
    name = f"base-{preset or job.spec.harness.preset}-{model}"
    job = with_tasks(job.model_copy(update={"spec": spec}), job_tasks(job, held_out.resolve().parent)[:sample], 1,
                     sample, name=name)
    with open(out / f"{name}.log", "w") as log:
        run = LocalRun(LocalOptions(job_path=held_out, output=str(out / name), work_dir=out / "work" / name,
                                    engine_url=engine_url, progress_interval_s=30.0), out=log, summary=log)
        run.job = job
        run.run()
    rewards = [r.result.reward for r in run.results]
    return (statistics.fmean(rewards) if rewards else None), len(rewards)


def sampling(job_path: Path) -> str:
    """The sampling a job's sessions run at, as the proxy applies it (spec.inference.sampling)."""
    from tracefleet.api.manifest import load_job

    stated = load_job(job_path).spec.inference.sampling.override().fields()
    return ", ".join(f"{k} {v:g}" for k, v in stated.items()) or "the engine's defaults"


def recipe_minutes(r: LoopResult) -> float:
    """The seed's minutes from the first demonstration to the last score: its wall time less vLLM's start and the
    scoring at policy 0 (the issue's budget counts from the first demonstration)."""
    before = sum(v for k, v in r.phase_s.items() if k.startswith("score_") and k.endswith("_before"))
    return round((r.wall_s - r.startup_s - before) / 60, 1)


def seed_row(seed: int, r: LoopResult) -> dict[str, object]:
    syncs = [s["sync_s"] for s in r.steps]
    mism = [s["mean_abs_dlogprob"] for s in r.steps if s.get("mean_abs_dlogprob") is not None]
    same = [s["same_version_max_abs_dlogprob"] for s in r.steps if s.get("same_version_max_abs_dlogprob") is not None]
    return {"seed": seed, "steps": len(r.steps), "wall_min": round(r.wall_s / 60, 1), "sessions": r.sessions,
            "held_out": [r.held_out_before, r.held_out_warm, r.held_out_after], "held_out_sessions": r.held_out_sessions,
            "train": [r.train_before, r.train_warm, r.train_after], "train_sessions": r.train_sessions,
            "warm": r.warm, "rewards": [s["reward_mean"] for s in r.steps],
            "syncs": len(syncs) + (1 if r.warm else 0), "sync_mean_s": statistics.fmean(syncs) if syncs else None,
            "sync_max_s": max(syncs) if syncs else None,
            "mismatch_mean": statistics.fmean(mism) if mism else None,
            "mismatch_max": max((s.get("max_abs_dlogprob") or 0.0) for s in r.steps) if r.steps else None,
            "same_version_max": max(same) if same else None,
            "train_mean_s": statistics.fmean(s["train_s"] for s in r.steps) if r.steps else None,
            "calls_aborted": r.calls_aborted, "tokens_aborted": r.tokens_aborted, "phase_s": r.phase_s,
            "flat_batches": len(r.flat), "rows_trained": [s.get("rows_trained") for s in r.steps],
            "stale_tokens_masked": sum(s["stale_tokens_masked"] for s in r.steps),
            "recipe_min": recipe_minutes(r), "kinds": r.kinds, "guided": r.guided,
            "sets": {name: scores.summary() | {"rewards": scores.rewards, "task_kinds": scores.kinds}
                     for name, scores in r.scores.items()}}


def set_scores(row: dict[str, object], name: str) -> SetScores | None:
    sets = row["sets"]
    assert isinstance(sets, dict)
    if name not in sets:
        return None
    got = sets[name]
    return SetScores(name=name, path=got["path"], rewards=got["rewards"], kinds=got["task_kinds"])


def print_sets(rows: list[dict[str, object]]) -> None:
    """Per scored set: per seed base / warm start / RL (± standard error) and RL's paired gain, then the mean of
    the seeds (± the seeds' standard error) and the gain paired over every seed's sessions."""
    names = list(dict.fromkeys(n for r in rows for n in r["sets"]))  # type: ignore[attr-defined]
    for name in names:
        print(f"\n{name}: base / warm start / RL (± standard error), RL over the warm start paired")
        print("seed  sessions  base          warm start    RL            RL gain (paired)  steps  flat skipped  minutes")
        pooled: dict[str, dict[str, float]] = {c: {} for c in CHECKPOINTS}
        for r in rows:
            s = set_scores(r, name)
            if s is None:
                continue
            for c in CHECKPOINTS:
                pooled[c].update({f"{r['seed']}/{k}": v for k, v in s.rewards.get(c, {}).items()})
            points = [line(s.point(c)) for c in CHECKPOINTS]
            print(f"{r['seed']:>4}  {s.point('after')[2]:>8}  {points[0]:<12}  {points[1]:<12}  {points[2]:<12}  "
                  f"{line(s.gain('warm', 'after'), signed=True):<16}  {r['steps']:>5}  {r['flat_batches']:>12}  "
                  f"{r['recipe_min']} ({r['wall_min']} in all)")
        means = []
        for c in CHECKPOINTS:
            seeds = [p for r in rows if (s := set_scores(r, name)) is not None and (p := s.point(c)[0]) is not None]
            means.append(line(mean_se(seeds) + (len(seeds),)))
        gain = paired_gain(pooled["warm"], pooled["after"])
        print(f"mean of {len(rows)} seeds: {means[0]} / {means[1]} / {means[2]}; RL over the warm start "
              f"{line(gain, signed=True)} paired over {gain[2]} sessions")
        kinds = SetScores(name=name, path="", rewards=pooled,
                          kinds={f"{r['seed']}/{k}": v for r in rows if (s := set_scores(r, name)) is not None
                                 for k, v in s.kinds.items()})
        by_kind = {c: kinds.by_kind(c) for c in CHECKPOINTS}
        print("by kind, every seed's sessions (solved/sessions at base / warm start / RL): " + ", ".join(
            f"{k} " + " / ".join(f"{by_kind[c].get(k, (0, 0))[0]}/{by_kind[c].get(k, (0, 0))[1]}" for c in CHECKPOINTS)
            for k in sorted({k for c in CHECKPOINTS for k in by_kind[c]})))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--minutes", type=float, default=20.0, help="GRPO minutes per seed")
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--demos", type=int, default=64)
    p.add_argument("--warm-epochs", type=int, default=DEFAULT_WARM_EPOCHS)
    p.add_argument("--warm-lr", type=float, default=DEFAULT_WARM_LR)
    p.add_argument("--warm-schedule", choices=WARM_SCHEDULES, default=DEFAULT_WARM_SCHEDULE)
    p.add_argument("--lr", type=float, default=DEFAULT_LR)
    p.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    p.add_argument("--train-layers", type=int, default=DEFAULT_TRAIN_LAYERS)
    p.add_argument("--warm-layers", type=int, help=f"the warm start's top N layers (0: every layer; default "
                   f"{DEFAULT_WARM_LAYERS})")
    p.add_argument("--max-lag", type=int, default=1)
    p.add_argument("--traces-per-step", type=int)
    p.add_argument("--score-limit", type=int, help="held-out (and train) tasks scored (default: all: 60 and 30 tasks)")
    p.add_argument("--score-train", type=int, default=24)
    p.add_argument("--base-sample", type=int, default=8, help="held-out tasks per --base-models model")
    p.add_argument("--base-models", nargs="*", default=["gemma3-270m"])
    p.add_argument("--base-presets", nargs="*", default=["codex"],
                   help="second CLIs: SmolLM2 through each on the held-out tasks (vLLM with the context --base-context)")
    p.add_argument("--base-context", type=int, default=8192,
                   help="the engine's context for --base-presets (codex's first prompt: ~6.5k tokens on SmolLM2)")
    p.add_argument("--skip-base-score", action="store_true",
                   help="the seeds' held-out sets not scored at policy 0 (the base weights: see --rows)")
    p.add_argument("--rows", type=Path,
                   help="an earlier run's bench.json: its seeds printed (and averaged) beside this run's")
    p.add_argument("--train-flat", action="store_true", help="also update on batches with no group of reward spread")
    p.add_argument("--task-sampling", choices=TASK_SAMPLINGS, default="rounds")
    p.add_argument("--explore", type=float, default=DEFAULT_EXPLORE)
    p.add_argument("--group-size", type=int, help="sessions per task in a group (default: the job's samplesPerTask)")
    p.add_argument("--advantage", choices=ADVANTAGES, default="grpo")
    p.add_argument("--flat-groups", choices=FLAT_GROUPS, default="keep")
    p.add_argument("--kl", type=float, default=0.0, help="the KL penalty towards the warm start (0: none)")
    p.add_argument("--target-kl", type=float, default=0.0,
                   help="the learning rate adapted to hold each step's KL near this (0: fixed at --lr)")
    p.add_argument("--demo-mix", type=float, default=0.0,
                   help="each GRPO update also minimises this times the demonstrations' NLL (0: none)")
    p.add_argument("--guide", type=float, default=0.0,
                   help="guided prefixes for tasks solved less than this share of the time (0: none)")
    p.add_argument("--schedule", choices=SCHEDULES, default=DEFAULT_SCHEDULE,
                   help="GRPO's steps beside the rollouts (overlap) or each with the engine paused (alternate)")
    p.add_argument("--job", type=Path, default=EXAMPLE / "job.yaml")
    p.add_argument("--held-out", type=Path, nargs="+",
                   default=[EXAMPLE / "held-out.yaml", EXAMPLE / "held-out-novel.yaml"],
                   help="held-out sets scored side by side (the base rates use the first)")
    p.add_argument("--vllm-url")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="tf-bench-harness-"))
    out.mkdir(parents=True, exist_ok=True)
    base = {}
    print(f"machine load: {load()}", flush=True)
    from tracefleet.api.manifest import load_job

    job_args = list(load_job(a.job).spec.inference.managed.extra_args or [])
    for model in a.base_models:
        t0 = time.monotonic()
        key = f"job harness / {model}"
        base[key] = base_rate(a.held_out[0], model, a.base_sample, out)
        print(f"base rate through {key} (CPU engine): {fmt(base[key][0])} over {base[key][1]} held-out sessions "
              f"({time.monotonic() - t0:.0f} s)", flush=True)
    if a.base_presets:
        # SmolLM2 on vLLM as the loop serves it (the job's output cap: llama.cpp's engine has none, and a rambling
        # sample then runs past the session timeout), the context larger for the second CLI's first prompt only
        t0 = time.monotonic()
        wide = launch(log=out / "vllm-base.log", extra_args=with_context(job_args, a.base_context))
        try:
            for preset in a.base_presets:
                t1 = time.monotonic()
                key = f"{preset} / smollm2"
                base[key] = base_rate(a.held_out[0], "smollm2", a.base_sample, out, preset, wide.url)
                print(f"base rate through {key} (vLLM, context {a.base_context}): {fmt(base[key][0])} over "
                      f"{base[key][1]} held-out sessions ({time.monotonic() - t1:.0f} s; vLLM started in "
                      f"{t1 - t0:.0f} s)", flush=True)
        finally:
            wide.stop()
    engine = None
    url = a.vllm_url
    if url is None:
        t0 = time.monotonic()
        engine = launch(log=out / "vllm.log", extra_args=job_args)
        url = engine.url
        print(f"vLLM up in {time.monotonic() - t0:.0f} s at {url}", flush=True)
    rows = []
    try:
        for seed in a.seeds:
            print(f"--- seed {seed}: {a.demos} demonstrations, warm start {a.warm_epochs} epochs at {a.warm_lr:g} "
                  f"({a.warm_schedule}) "
                  f"on {layers_text(warm_layers_option(a.warm_layers))}, "
                  f"GRPO {a.minutes:g} min at {a.lr:g}; tasks in {a.task_sampling}, groups of "
                  f"{a.group_size or 'the job'}, advantage {a.advantage}, flat groups {a.flat_groups}, KL {a.kl:g}, "
                  f"target KL {a.target_kl:g}, demo mix {a.demo_mix:g}, guide "
                  f"{a.guide:g}, schedule {a.schedule}", flush=True)
            r = run_loop(LoopOptions(job_path=a.job, iterations=a.iterations, minutes=a.minutes, lr=a.lr,
                                     max_lag=a.max_lag, seed=seed, traces_per_step=a.traces_per_step,
                                     output=out / f"seed-{seed}", engine_url=url, held_out=a.held_out,
                                     train_layers=a.train_layers or None, epochs=a.epochs, demos=a.demos,
                                     warm_epochs=a.warm_epochs, warm_lr=a.warm_lr, score_limit=a.score_limit,
                                     warm_layers=warm_layers_option(a.warm_layers), warm_schedule=a.warm_schedule,
                                     score_train=a.score_train, train_flat=a.train_flat,
                                     task_sampling=a.task_sampling, explore=a.explore, group_size=a.group_size,
                                     advantage=a.advantage, flat_groups=a.flat_groups, kl=a.kl, target_kl=a.target_kl,
                                     demo_mix=a.demo_mix, guide=a.guide,
                                     score_base=not a.skip_base_score, schedule=a.schedule))
            rows.append(seed_row(seed, r) | {"load": load()})
            print(json.dumps(rows[-1]), flush=True)
            (out / "bench.json").write_text(json.dumps({"base": base, "seeds": rows}, indent=1))
    finally:
        if engine is not None:
            engine.stop()
    if a.rows is not None:  # an earlier run's seeds (their base rates too, where this run measured none)
        earlier = json.loads(a.rows.read_text())
        base = earlier.get("base", {}) | base
        rows = [r for r in earlier["seeds"] if r["seed"] not in {n["seed"] for n in rows}] + rows
        (out / "bench.json").write_text(json.dumps({"base": base, "seeds": rows}, indent=1))
    print(f"\nbase rate on the held-out tasks (the job's sampling: {sampling(a.held_out[0])}; before anything is "
          "trained):")
    for key, (mean, n) in base.items():
        print(f"  {key}: {fmt(mean)} over {n} sessions")
    print("\nseed  steps  wall min  held-out base/warm/RL    train base/warm/RL    syncs (mean/max s)  "
          "|dlp| mean / max / same-version max   aborted")
    for r in rows:
        ho, tr = r["held_out"], r["train"]
        print(f"{r['seed']:>4}  {r['steps']:>5}  {r['wall_min']:>8}  {fmt(ho[0])} / {fmt(ho[1])} / {fmt(ho[2]):<8}  "
              f"{fmt(tr[0])} / {fmt(tr[1])} / {fmt(tr[2]):<8}  {r['syncs']} ({fmt(r['sync_mean_s'])}/{fmt(r['sync_max_s'])})"
              f"  {fmt(r['mismatch_mean'], 4)} / {fmt(r['mismatch_max'], 3)} / {fmt(r['same_version_max'], 5)}  "
              f"{r['calls_aborted']}/{r['tokens_aborted']}")
    for r in rows:
        print(f"seed {r['seed']}: seconds per phase {r['phase_s']}; warm start {r['warm'].get('record_s')} s recording "
              f"{r['warm'].get('demos')} demonstrations, {r['warm'].get('sft_s')} s training; GRPO rows trained per "
              f"step {r['rows_trained']}, {r['flat_batches']} flat batches skipped; load {r['load']}"
              + (f"; guided {r['guided']}" if r.get("guided") else ""))
    print_sets(rows)
    final = [r["held_out"][2] for r in rows if r["held_out"][2] is not None]
    gain = [r["held_out"][2] - r["held_out"][1] for r in rows if None not in r["held_out"][1:]]
    if final:
        print(f"mean held-out after RL over {len(final)} seeds: {statistics.fmean(final):.2f} (goal >= 0.5); "
              f"GRPO over the warm start: {statistics.fmean(gain) if gain else float('nan'):+.2f} (goal >= +0.15); "
              f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
