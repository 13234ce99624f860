"""The whole loop on one machine: `tracefleet train JOB.yaml`.

One process holds the three parts of reinforcement learning through a harness, running at the same time:

- **the engine**: real vLLM (its CPU build) serving the job's shipped model (SmolLM2-135M-Instruct), started
  with the arguments every tracefleet vLLM gets (`--logprobs-mode processed_logprobs`, dev-mode routes);
- **the rollouts**: the job, run by the local driver (`tracefleet run`'s LocalRun) against that engine in a
  background thread, its inline tasks repeated round after round (each round a new GRPO group per task), so
  sessions keep coming while the trainer trains: sealed batches land in the loop's own bucket directory;
- **the trainer**: the reference GRPO trainer (tracefleet.trainer.grpo) reading `BatchReader.follow()`: one
  step per batch, the new weights written as a checkpoint and put into the engine by `update_policy`
  (pause keep → reload → version label → resume), while the sessions in flight are frozen and continue.

Asynchrony with a staleness bound: tokens sampled by a version older than `version - max_lag` are masked out
of the loss (the reader's per-token versions), and once `max_lag` sealed batches wait behind the one being
trained the engine is held paused (mode keep) until the update (GenerationHold), so rollouts never run further
ahead than the bound lets their tokens be trained on. A batch with nothing left within the bound is skipped
(no update, no new version), and so is one in which no group has reward spread (every advantage 0: a zero
gradient) unless `train_flat`; a step computes only the rows with a non-zero advantage (`with_signal`).

The trainer keeps to one torch thread beside the rollouts (TRAINER_THREADS) and takes every core when it has the
machine to itself: the warm start, and with `schedule` `alternate` each GRPO step, the engine paused (keep) for it.

It stops after `iterations` steps or `minutes`, whichever comes first; each step prints one line (reward of
the batch, train/inference mismatch, sync seconds, requests kept/aborted, stale tokens masked) and appends it to
`loop.jsonl` in the run's folder. `held_out`: jobs whose tasks are scored (never trained on) before the first
update, after the warm start and after the last one, side by side (tracefleet.trainer.scores: paired gains).

The recipe's levers (docs/training/real-harness.md): which task the rollouts run next (`task_sampling`,
tracefleet.trainer.task_sampler), the group size, the advantage (`grpo`, `dr-grpo` or `positive`) and what a flat
group counts for in the loss (`flat_groups`). Whatever they are, a token in the loss is one the engine sampled for
the policy (`unsampled_trained_tokens` refuses a batch otherwise).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

from tracefleet.trainer.jobs import TRAIN_MODELS, job_tasks, trained_model, with_tasks
from tracefleet.trainer.scores import SetScores
from tracefleet.trainer.scores import line as score_line
from tracefleet.trainer.step_size import adapted_lr
from tracefleet.trainer.task_sampler import (DEFAULT_EXPLORE, ROUND_SEP, TaskSampler, TaskSampling, base_task,
                                             task_kind)
from tracefleet.usage import UsageError

CONSUMER = "tracefleet-train"
KEEP_CHECKPOINTS = 2  # the newest checkpoints kept on disk (each is the whole model: ~0.5 GB for SmolLM2)
POLL_S = 1.0
# the top decoder layers trained by default: a step's backward pass and the checkpoint a sync reloads stay
# small enough for 2 CPU cores (SmolLM2 has 30)
DEFAULT_TRAIN_LAYERS = 4
ENGINE_ABORTED_KIND = "engine_aborted"  # a capture record's error kind when the engine aborted the call (proxy.errors)
PRODUCER_STOP_S = 120.0
# The supervised warm start on demonstrations (tracefleet.trainer.demos): passes over them and AdamW's rate. The
# tool a session's first call names is one token per demonstration, the last the warm start fits: after two passes
# one kind or another still opens with the marginal's tool, after four with a decaying rate every kind with its own
# (docs/training/real-harness.md, "A warm start that fits the first call": held-out 0.86 against 0.56-0.74).
DEFAULT_WARM_EPOCHS = 4
DEFAULT_WARM_LR = 5e-4
# The warm start's top decoder layers (--warm-layers): more than GRPO's steps train, because copying the task's
# file names and text into the tool calls is what the top 4 alone did not learn (docs/training/real-harness.md,
# "A deeper warm start": held-out 0.28-0.36 on 4 layers, 0.68-0.74 on 12, the same demonstrations and seed).
DEFAULT_WARM_LAYERS = 12
# The warm start's learning rate over its updates: `constant` holds it, `linear` decays it to 0 (grpo.sft's decay),
# so the last updates, which set the first call's tool when the rate stays (docs/training/real-harness.md, "What
# sets the first call's tool"), are small.
WarmSchedule = Literal["constant", "linear"]
WARM_SCHEDULES: tuple[WarmSchedule, ...] = ("constant", "linear")
DEFAULT_WARM_SCHEDULE: WarmSchedule = "linear"
# What bench/loop.py measured learning on the quickstart's tasks within 20 minutes on 2 cores (docs/performance.md,
# "The loop"): AdamW at 1e-4 on the top 4 layers, two passes over each batch. After the four-epoch warm start 2e-4
# moved the policy without raising its score and 5e-4 broke its tool-call format (docs/training/real-harness.md,
# "GRPO's step size on the four-epoch warm start").
DEFAULT_LR = 1e-4
DEFAULT_EPOCHS = 2
# The trainer's torch threads unless told. vLLM's CPU build binds its OpenMP threads to every core but one
# (`reserve_cpu_num` 1 in its log) and spins them; a trainer with a thread per core keeps one of its threads on a
# core vLLM holds, and each of its parallel regions waits for that thread. Measured on 2 cores, one 12-trace step:
# 101 s with 2 threads beside the rollouts, 12 s with 1 thread alone and 6 s with 2 threads alone.
TRAINER_THREADS = 1
# When the trainer has the machine to itself, it takes every core the process may run on: the warm start (the
# demonstrations are recorded before it and the engine is idle: one epoch over 16 of them took 81.4 s on 1
# thread and 47.1 s on 2, the same NLL; bench/trainer_threads.py) and, with the `alternate` schedule, each GRPO step.
# `overlap` runs the rollouts beside the trainer's steps (its one thread, TRAINER_THREADS); `alternate` pauses the
# engine (mode keep: the sessions in flight frozen, nothing lost) for each step, which then trains on every core.
Schedule = Literal["overlap", "alternate"]
SCHEDULES: tuple[Schedule, ...] = ("overlap", "alternate")
DEFAULT_SCHEDULE: Schedule = "overlap"
# The advantage of a session in its group (tracefleet.traces.advantages): `grpo` divides r - mean by the group's
# standard deviation, `dr-grpo` does not (Dr. GRPO: centred only); `positive` is `grpo`'s with every negative one
# set to 0 (positive-sample reinforcement): only the sessions above their group's mean are pushed up, none pushed
# down. Against `grpo` on the example's warm start (docs/training/real-harness.md) it gained no more, two seeds.
Advantage = Literal["grpo", "dr-grpo", "positive"]
ADVANTAGES: tuple[Advantage, ...] = ("grpo", "dr-grpo", "positive")
# A group whose rewards are all equal (advantage 0, no gradient): `keep` it in the batch, its trainable tokens
# counted in the loss's mean (the step's gradient is the whole batch's); `drop` it, the loss the mean over the
# groups with spread (Tinker's remove_constant_reward_groups, ScaleRL's zero-variance filtering). Either way its
# rows get no forward pass (with_signal).
FlatGroups = Literal["keep", "drop"]
FLAT_GROUPS: tuple[FlatGroups, ...] = ("keep", "drop")


@dataclass
class LoopOptions:
    job_path: Path
    iterations: int = 20
    minutes: float | None = None
    lr: float = DEFAULT_LR
    max_lag: int = 1
    seed: int = 0
    traces_per_step: int | None = None  # default: the job's output.tracesPerBatch
    output: Path | None = None  # the run's folder (batches, checkpoints, logs); default ./tracefleet-output/<job>-train-<time>
    engine_url: str | None = None  # a vLLM already started like `tracefleet engine --backend vllm`: reset to the base weights first
    held_out: list[Path] = field(default_factory=list)  # held-out jobs, each scored (never trained on), side by side
    parallelism: int | None = None
    torch_threads: int | None = None
    train_layers: int | None = DEFAULT_TRAIN_LAYERS  # None: every layer
    warm_layers: int | None = DEFAULT_WARM_LAYERS  # the warm start's top N layers (None: every layer)
    epochs: int = DEFAULT_EPOCHS  # optimizer updates per batch (grpo_step)
    demos: int | None = None  # record this many demonstrations through the job's harness, then warm-start on them
    warm_start: Path | None = None  # or warm-start on demonstrations recorded before (tracefleet.trainer.demos)
    warm_epochs: int = DEFAULT_WARM_EPOCHS
    warm_lr: float = DEFAULT_WARM_LR
    warm_schedule: WarmSchedule = DEFAULT_WARM_SCHEDULE
    score_limit: int | None = None  # score at most this many tasks of each scored set (held-out, train)
    score_train: int = 0  # also score this many of the job's own tasks (the last ones, one sample each)
    score_base: bool = True  # score the sets at policy 0 too (the base weights score alike in every run of a model)
    train_flat: bool = False  # also update on a batch in which no group has reward spread (a zero gradient)
    task_sampling: TaskSampling = "rounds"  # which task the rollouts run next (tracefleet.trainer.task_sampler)
    explore: float = DEFAULT_EXPLORE  # `spread`: the share of groups spread over the kinds evenly (no kind starves)
    group_size: int | None = None  # sessions per task in a group (default: the job's samplesPerTask)
    advantage: Advantage = "grpo"
    flat_groups: FlatGroups = "keep"
    kl: float = 0.0  # the KL penalty's coefficient towards the policy GRPO starts from (grpo_step); 0: none
    target_kl: float = 0.0  # each step's KL from the policy before it, held near this by the learning rate; 0: fixed
    demo_mix: float = 0.0  # each GRPO update also minimises this times the demonstrations' NLL (demo_mix); 0: none
    guide: float = 0.0  # guide the groups of tasks whose pass rate is below this (tracefleet.trainer.guide); 0: none
    schedule: Schedule = DEFAULT_SCHEDULE  # GRPO's steps beside the rollouts, or each with the engine paused


@dataclass
class LoopResult:
    run_dir: Path
    steps: list[dict[str, Any]] = field(default_factory=list)
    held_out_before: float | None = None
    held_out_after: float | None = None
    held_out_sessions: int = 0
    held_out_warm: float | None = None  # after the warm start, before the first GRPO step
    train_before: float | None = None  # the job's own tasks (score_train of them), scored like the held-out ones
    train_warm: float | None = None
    train_after: float | None = None
    train_sessions: int = 0
    warm: dict[str, Any] = field(default_factory=dict)  # the warm start: demonstrations, NLL per epoch, seconds
    wall_s: float = 0.0
    startup_s: float = 0.0
    tokens_aborted: int = 0
    calls_aborted: int = 0
    sessions: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)  # batches with nothing within the staleness bound
    flat: list[dict[str, Any]] = field(default_factory=list)  # batches in which no group had reward spread
    phase_s: dict[str, float] = field(default_factory=dict)  # seconds per phase: scoring, demonstrations, warm start, GRPO
    # every scored set (each held-out job by its name, and "train"): its per-session rewards at each checkpoint
    scores: dict[str, SetScores] = field(default_factory=dict)
    kinds: dict[str, dict[str, float | int]] = field(default_factory=dict)  # the rollouts' pass rate per task kind
    guided: dict[str, Any] = field(default_factory=dict)  # --guide: the groups guided and sessions per guided calls

    def reward_rise(self) -> tuple[float | None, float | None]:
        """Mean batch reward over the first two steps and over the last two."""
        rewards = [s["reward_mean"] for s in self.steps if s.get("reward_mean") is not None]
        if len(rewards) < 2:
            return None, None
        return sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2


def warm_layers_option(flag: int | None) -> int | None:
    """`--warm-layers N` (CLI and bench) as LoopOptions.warm_layers: unset DEFAULT_WARM_LAYERS, 0 every layer (None)."""
    return DEFAULT_WARM_LAYERS if flag is None else flag or None


def layers_text(layers: int | None) -> str:
    return "every layer" if layers is None else f"the top {layers} layers"


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def sci(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def step_line(s: dict[str, Any]) -> str:
    """One step as the command prints it."""
    kl = f"KL {sci(s.get('kl'))}  " if "kl" in s else ""
    step = f"lr {s['lr']:.3g}, step KL {sci(s['step_kl'])} in {s['updates']} update(s)  " if "step_kl" in s else ""
    step += f"demo NLL {sci(s['demo_nll'])}  " if "demo_nll" in s else ""
    return (f"step {s['step']:>3}  v{s['version']}  reward {fmt(s['reward_mean'])} ({s['rows']} traces, "
            f"{s['groups_with_signal']}/{s['groups']} groups with signal)  loss {fmt(s.get('loss'), 4)}  "
            f"{kl}{step}"
            f"|dlogprob| mean {sci(s.get('mean_abs_dlogprob'))} max {sci(s.get('max_abs_dlogprob'))}  "
            f"(same version {sci(s.get('same_version_max_abs_dlogprob'))})  "
            f"ratio [{fmt(s.get('ratio_min'), 3)}, {fmt(s.get('ratio_max'), 3)}]  "
            f"clipped {fmt(s.get('clipped_share'))} after {s.get('epochs', 1)} epoch(s)  train {s['train_s']:.1f} s  "
            f"sync {s['sync_s']:.1f} s (paused {s['paused_s']:.1f} s; kept {s['kept']}, aborted {s['aborted']})  "
            f"stale masked {s['stale_tokens_masked']}  lag<= {s['max_lag_seen']}")


# ---------------------------------------------------------------- the job the loop runs


def repeated_job(job: Any, base_dir: Path, rounds: int, traces_per_step: int | None,
                 last: frozenset[str] = frozenset(), group_size: int | None = None) -> Any:
    """`job` with its tasks repeated `rounds` times (ids <task>-r<k>: each round is a new group per task, the
    rounds in order), sealed `traces_per_step` traces per batch, `group_size` sessions per task (default the job's
    samplesPerTask). The tasks whose ids are in `last` (those the warm start's demonstrations solved) come last
    in each round: the policy repeats them, so their groups carry no signal until it has tried the others."""
    spec = job.spec
    tasks = job_tasks(job, base_dir)
    tasks = [t for t in tasks if t.id not in last] + [t for t in tasks if t.id in last]
    per_round = len(tasks)
    rounds = max(1, min(rounds, 1000 // per_round))  # Tasks.inline holds at most 1000
    repeated = [t.model_copy(update={"id": f"{t.id}{ROUND_SEP}{k}"}) for k in range(rounds) for t in tasks]
    return with_tasks(job, repeated, group_size or spec.tasks.samples_per_task,
                      traces_per_step or spec.output.traces_per_batch)



def check_job(path: Path, what: str) -> None:
    from tracefleet.runner.cli import check_job_file

    problems = check_job_file(path)
    if problems:
        raise UsageError(f"{what}: " + "; ".join(problems))


def check_sampling(job: Any, what: str) -> None:
    """The trainer scores each token at the temperature its span records, nothing else: a job whose sampling cuts
    the distribution (spec.inference.sampling topP/topK) would be trained against logprobs it does not compute."""
    sampling = job.spec.inference.sampling
    cut = [name for name, value in (("topP", sampling.top_p), ("topK", sampling.top_k)) if value is not None]
    if cut:
        raise UsageError(f"{what}: spec.inference.sampling.{' and '.join(cut)}: tracefleet train scores tokens at "
                         "their temperature only (the full distribution); set temperature alone")


class Rollouts:
    """The job's sessions against the loop's engine, in a background thread (LocalRun, as `tracefleet run`)."""

    def __init__(self, job_path: Path, job: Any, engine_url: str, bucket: Path, work_dir: Path,
                 parallelism: int | None, log: Path, sampler: TaskSampler | None = None, guide: Any = None,
                 guide_url: str | None = None) -> None:
        from tracefleet.runner.local import LocalOptions, LocalRun

        self.log = open(log, "a")  # noqa: SIM115 - closed in join()
        self.run = LocalRun(LocalOptions(job_path=job_path, output=str(bucket), engine_url=engine_url,
                                         work_dir=work_dir, parallelism=parallelism, progress_interval_s=30.0,
                                         guide_url=guide_url),
                            out=self.log, summary=self.log)
        self.run.job = job
        # the sampler's view when it last picked: groups started and sessions solved per kind, a new dict each time
        # (the trainer's thread reads it while the rollouts' thread replaces it)
        self.kinds: dict[str, dict[str, float | int]] = {}
        self.guide = guide  # tracefleet.trainer.guide.Guide: each group's guided calls, from its task's pass rate
        if sampler is not None:
            self.run.next_session = lambda queue: self._next(sampler, queue)
        self.status: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="rollouts", daemon=True)

    def _main(self) -> None:
        try:
            self.status = self.run.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the trainer's loop
            self.error = exc

    def _next(self, sampler: TaskSampler, queue: list[Any]) -> int:
        sampler.observe([r.result for r in self.run.results])  # the rollouts' thread: the one that appends them
        index = sampler.next_index(queue)
        self.kinds = sampler.kinds()
        if self.guide is not None:
            plan = queue[index]
            rate = sampler.rates.task_rate(base_task(plan.task.id), task_kind(plan.task.metadata))
            queue[index] = self.guide.plan(plan, rate)
        return index

    def start(self) -> Rollouts:
        self.thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout_s: float = PRODUCER_STOP_S) -> None:
        self.run.stop.set()  # running sessions are killed; what finished is sealed
        self.thread.join(timeout_s)
        self.log.close()

    def mean_reward(self) -> float | None:
        rewards = [r.result.reward for r in self.run.results]
        return sum(rewards) / len(rewards) if rewards else None


def score_held_out(path: Path, engine_url: str, run_dir: Path, tag: str, parallelism: int | None,
                   limit: int | None = None, last: int | None = None) -> list[Any]:
    """The held-out job's sessions (SessionResult) on the engine's current weights (their batches go to a
    folder of their own: nothing trains on them). `limit`: its first N tasks only; `last`: its last N tasks, one
    sample each (the training job's own tasks, scored like held-out ones)."""
    from tracefleet.api.manifest import load_job
    from tracefleet.runner.local import LocalOptions, LocalRun

    job = load_job(path)
    tasks = job_tasks(job, path.resolve().parent)
    samples = job.spec.tasks.samples_per_task
    if last is not None:
        tasks, samples = tasks[-last:], 1
    if limit is not None:
        tasks = tasks[:limit]
    scored = with_tasks(job, tasks, samples, max(1, min(job.spec.output.traces_per_batch, len(tasks) * samples)))
    with open(run_dir / f"held-out-{tag}.log", "w") as log:
        run = LocalRun(LocalOptions(job_path=path, output=str(run_dir / f"held-out-{tag}"), engine_url=engine_url,
                                    work_dir=run_dir / "work" / f"held-out-{tag}", parallelism=parallelism,
                                    progress_interval_s=30.0), out=log, summary=log)
        run.job = scored
        run.run()
    return [r.result for r in run.results]


def aborted_tokens(capture_root: Path) -> tuple[int, int]:
    """(calls, sampled tokens) the engine aborted, from the proxy's capture records: what syncs wasted."""
    calls = tokens = 0
    for path in capture_root.rglob("*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if (rec.get("error") or {}).get("kind") == ENGINE_ABORTED_KIND:
                calls += 1
                tokens += len(rec.get("completion_ids") or ())
    return calls, tokens


# ---------------------------------------------------------------- the loop


class Loop:
    def __init__(self, options: LoopOptions, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.o = options
        self.out = out
        self.err = err
        self.demo_mix: Any = None  # the demonstrations' rows each GRPO step mixes in (--demo-mix), by kind

    def say(self, text: str) -> None:
        print(f"tracefleet train: {text}", file=self.err, flush=True)

    def run(self) -> LoopResult:
        o = self.o
        if o.iterations < 1:
            raise UsageError("--iterations must be at least 1")
        if o.max_lag < 0:
            raise UsageError("--max-lag must be 0 or more")
        if o.epochs < 1:
            raise UsageError("--epochs must be at least 1")
        if o.group_size is not None and o.group_size < 2:
            raise UsageError("--group-size must be 2 or more: a group of one session has no reward spread")
        if not 0 <= o.explore <= 1:
            raise UsageError("--explore must be between 0 and 1")
        if o.kl < 0:
            raise UsageError("--kl must be 0 (no penalty) or more")
        if o.target_kl < 0:
            raise UsageError("--target-kl must be 0 (the learning rate fixed) or more")
        if o.demo_mix < 0:
            raise UsageError("--demo-mix must be 0 (none) or more")
        if o.demo_mix and not (o.demos or o.warm_start):
            raise UsageError("--demo-mix mixes the warm start's demonstrations into GRPO's steps: give --demos or "
                             "--warm-start")
        if o.guide < 0:
            raise UsageError("--guide must be 0 (no guide) or a pass rate up to 1")
        if o.train_flat and o.flat_groups == "drop":
            raise UsageError("--train-flat updates on batches whose groups have no reward spread, --flat-groups drop "
                             "leaves such groups out: choose one")
        check_job(o.job_path, str(o.job_path))
        for path in o.held_out:
            check_job(path, f"--held-out {path}")
        from tracefleet.api.manifest import load_job

        job = load_job(o.job_path)
        model = trained_model(job)
        check_sampling(job, str(o.job_path))
        if o.demos or o.warm_start:
            from tracefleet.trainer import demos

            # before the engine's minutes of start-up: tasks no script can solve, or no demonstrations there
            demos.demo_tasks(job, o.job_path.resolve().parent, o.demos) if o.demos else demos.find(o.warm_start)  # type: ignore[arg-type]
        guide = None
        if o.guide:
            from tracefleet.trainer.guide import Guide

            guide = Guide(job, o.job_path.resolve().parent, o.guide)  # before vLLM's start: a job it cannot guide
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as exc:
            raise UsageError(f"the trainer needs torch and transformers ({exc.name} is missing): "
                             "pip install -e '.[trainer]'") from None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = (o.output or Path("tracefleet-output") / f"{job.name}-train-{stamp}").resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        result = LoopResult(run_dir=run_dir)
        t0 = time.monotonic()
        managed = job.spec.inference.managed
        engine, engine_url, model_dir = self._engine(model, run_dir, list(managed.extra_args or []) if managed else [])
        try:
            result.startup_s = time.monotonic() - t0
            self._train(job, engine_url, model_dir, run_dir, result, guide)
        finally:
            if guide is not None:
                guide.stop()  # stopped with the rollouts; here too when they never started
            if engine is not None:
                engine.stop()
        result.wall_s = time.monotonic() - t0
        self._summary(result)
        return result

    def _engine(self, model: str, run_dir: Path, extra_args: list[str]) -> tuple[Any, str, Path]:
        """(the vLLM this loop started or None, its URL, the model directory the trainer loads)."""
        from tracefleet.engine.vllm_local import VllmFailed, VllmMissing, converted_model, launch
        from tracefleet.trainer.control import PolicyUpdateFailed, update_policy

        if self.o.engine_url:
            url = self.o.engine_url.rstrip("/")
            model_dir = served_model_dir(url)
            self.say(f"using vLLM at {url}: putting the base weights back ({model_dir}) as policy 0")
            try:
                update_policy([url], model_dir, 0)
            except (PolicyUpdateFailed, ValueError) as exc:
                raise UsageError(f"--engine-url {url}: cannot reset it to the base weights: {exc}") from None
            return None, url, model_dir
        self.say(f"starting vLLM (CPU build) with {model}: about two minutes on 2 cores ...")
        try:
            engine = launch(log=run_dir / "vllm.log", model=model, extra_args=extra_args)
        except (VllmMissing, VllmFailed) as exc:
            raise UsageError(str(exc).splitlines()[0]) from None
        return engine, engine.url, converted_model(model)

    def _train(self, job: Any, engine_url: str, model_dir: Path, run_dir: Path, result: LoopResult,
               guide: Any = None) -> None:
        import torch

        from tracefleet.dashboard.trackers import StepLogger
        from tracefleet.traces import BatchReader
        from tracefleet.traces.reader import take_rows
        from tracefleet.trainer.control import update_policy
        from tracefleet.trainer.grpo import grpo_step, load_policy, reference_weights, save_weights, train_top, trainable

        o = self.o
        torch.manual_seed(o.seed)
        torch.set_num_threads(o.torch_threads or machine_threads())  # the warm start: the engine idle
        if o.score_base:
            self._score(engine_url, run_dir, result, "before", 0)
        warm = o.demos or o.warm_start
        policy = load_policy(model_dir, o.warm_layers if warm else o.train_layers)
        version, demonstrated = 0, frozenset()
        if warm:
            version, demonstrated = self._warm_start(policy, engine_url, run_dir, result)
            train_top(policy, o.train_layers)  # GRPO's layers; the engine keeps the warm start's below them
            self._score(engine_url, run_dir, result, "warm", version)
        torch.set_num_threads(step_threads(o))
        optimizer = torch.optim.AdamW(trainable(policy), lr=o.lr)
        reference = reference_weights(policy) if o.kl else None  # the policy GRPO starts from: the warm start's
        loop_job = repeated_job(job, o.job_path.resolve().parent, o.iterations + o.max_lag + 2, o.traces_per_step,
                                demonstrated, o.group_size)
        group_size = loop_job.spec.tasks.samples_per_task
        sampler = TaskSampler(o.task_sampling, group_size, o.explore, o.seed)
        bucket = run_dir / "batches"
        guide_url = guide.start(run_dir) if guide is not None else None
        # the sampler picks each next session under `spread`, and keeps the pass rates the guide reads
        picks = o.task_sampling == "spread" or guide is not None
        rollouts = Rollouts(o.job_path, loop_job, engine_url, bucket, run_dir / "work", o.parallelism,
                            run_dir / "rollouts.log", sampler if picks else None, guide, guide_url).start()
        layers = layers_text(o.train_layers)
        self.say(f"rollouts running ({run_dir / 'rollouts.log'}); training {layers} for {o.iterations} steps"
                 f"{f' or {o.minutes:g} min' if o.minutes else ''}, lr {o.lr:g}, staleness bound {o.max_lag}; "
                 f"groups of {group_size}, tasks in {o.task_sampling}, advantage {o.advantage}, flat groups "
                 f"{o.flat_groups}{f', KL {o.kl:g} towards policy {version}' if o.kl else ''}"
                 f"{f', the rate adapted to a KL of {o.target_kl:g} per step' if o.target_kl else ''}"
                 f"{f', {o.demo_mix:g} x the NLL of a demonstration of every kind per update' if o.demo_mix else ''}"
                 f"{f', groups of tasks solved less than {o.guide:g} of the time guided' if guide else ''}; "
                 f"schedule {o.schedule} (the trainer on {step_threads(o)} thread(s))")
        started = time.monotonic()
        deadline = started + o.minutes * 60 if o.minutes else math.inf
        reader = BatchReader(str(bucket), job.name, consumer=CONSUMER)
        hold = GenerationHold(engine_url, reader, o.max_lag, every_step=o.schedule == "alternate")
        log = open(run_dir / "loop.jsonl", "a")  # noqa: SIM115
        board = StepLogger(run_dir, self.err)  # the same figures in TensorBoard event files (RUN/tensorboard/), MLflow
        try:
            for batch in reader.follow(poll_s=POLL_S, timeout_s=None):
                t_step = time.monotonic()
                backlog = hold.backlog(batch.seq)
                bound = max(0, version - o.max_lag)
                t = batch.tensors(min_policy_version=bound, normalize_std=o.advantage != "dr-grpo")
                if o.advantage == "positive":
                    t = positive_advantages(t)
                group_ids = [g for g, k in zip(batch.table.column("group_id").to_pylist(), t["trained"].tolist(),
                                               strict=True) if k]
                t = take_rows(t, t["trained"])  # the rows in the loss: the step's figures are theirs
                rows = int(t["input_ids"].shape[0])
                if not rows or not float(t["loss_mask"].sum()):
                    # every token older than the bound (or none at all): no update, no new version
                    hold.release()
                    reader.commit(batch)
                    result.skipped.append({"seq": batch.seq, "rows": rows, "stale_tokens_masked": stale_tokens(t, bound)})
                    self.say(f"batch {batch.seq}: nothing within the staleness bound to train on; skipped")
                    continue
                unsampled = unsampled_trained_tokens(t)
                if unsampled:
                    # never the case for the loop's own sessions: a trainable token is one the engine sampled
                    raise RuntimeError(f"batch {batch.seq}: {unsampled} trainable tokens that no policy version "
                                       "sampled; the loop trains only on the policy's own samples")
                signal = with_signal(t)
                if signal is None and not o.train_flat:
                    # every advantage 0: the gradient is zero, an update would only move AdamW's moments
                    hold.release()
                    reader.commit(batch)
                    result.flat.append({"seq": batch.seq, "rows": rows, "reward_mean": float(t["rewards"].mean()),
                                        "elapsed_s": round(time.monotonic() - started, 1)})
                    self.say(f"batch {batch.seq}: reward {float(t['rewards'].mean()):.2f}, no group with reward "
                             "spread (zero gradient); skipped")
                    if time.monotonic() >= deadline:
                        break
                    continue
                with hold.watching(batch.seq):
                    stats = grpo_step(policy, optimizer, signal or t, policy_version=version, epochs=o.epochs,
                                      tokens=float(t["loss_mask"].sum()) if o.flat_groups == "keep" else None,
                                      reference=reference, kl_coef=o.kl, target_kl=o.target_kl,
                                      demos=self.demo_mix.rows(len(result.steps)) if self.demo_mix else None,
                                      demo_coef=o.demo_mix)
                stats["lr"] = optimizer.param_groups[0]["lr"]
                if o.target_kl:
                    for group in optimizer.param_groups:
                        group["lr"] = adapted_lr(stats["lr"], stats["step_kl"], o.target_kl, o.lr)
                train_s = time.monotonic() - t_step
                version += 1
                ckpt = save_weights(policy, run_dir / "checkpoints" / f"policy-{version}")
                report = update_policy([engine_url], ckpt, version)
                hold.updated()
                reader.commit(batch)
                prune_checkpoints(run_dir / "checkpoints", KEEP_CHECKPOINTS)
                step = step_record(len(result.steps) + 1, version, t, group_ids, stats, bound, report, train_s, backlog)
                step["rows_trained"] = int((signal or t)["input_ids"].shape[0])
                step["step_s"] = round(time.monotonic() - t_step, 3)
                step["elapsed_s"] = round(time.monotonic() - started, 1)
                step["holds"] = hold.holds
                if rollouts.kinds:
                    step["kinds"] = rollouts.kinds
                result.steps.append(step)
                print(step_line(step), file=self.out, flush=True)
                log.write(json.dumps(step) + "\n")
                board.log(step)
                log.flush()
                if len(result.steps) >= o.iterations or time.monotonic() >= deadline:
                    break
                if not rollouts.alive and not hold.backlog(batch.seq):
                    break  # the rollouts ended (every round ran, or it failed: see below)
        finally:
            log.close()
            board.close()
            hold.release()  # never leave the engine paused: the held-out scoring, or its owner, samples next
            self.say("stopping the rollouts (running sessions are killed, finished ones sealed) ...")
            rollouts.join()
            if guide is not None:
                guide.stop()
                result.guided = guide.groups.summary()
        if rollouts.error is not None and not result.steps:
            raise RuntimeError(f"the rollouts failed: {rollouts.error} (see {run_dir / 'rollouts.log'})")
        result.phase_s["grpo"] = round(time.monotonic() - started, 1)
        result.sessions = len(rollouts.run.results)
        sampler.observe([r.result for r in rollouts.run.results])  # the rollouts' thread has ended
        result.kinds = sampler.rates.by_kind()
        result.calls_aborted, result.tokens_aborted = aborted_tokens(run_dir / "work" / "capture")
        self._score(engine_url, run_dir, result, "after", version)

    def _score(self, engine_url: str, run_dir: Path, result: LoopResult, tag: str, version: int) -> None:
        """The held-out sets (and score_train of the job's own tasks) on the engine's current weights. The first
        held-out set is also `held_out_<tag>` (and its folders held-out-<tag>); the others are scored beside it,
        each under its job's name."""
        o = self.o
        sets = [("held-out", "held_out" if i == 0 else None, path, None) for i, path in enumerate(o.held_out)]
        if o.score_train:
            sets.append(("train", "train", o.job_path, o.score_train))
        for what, attr, path, last in sets:
            name = "train" if attr == "train" else held_out_name(path, o.held_out)
            folder = {"held_out": tag, "train": f"train-{tag}"}.get(attr or "", f"{name}-{tag}")
            self.say(f"scoring the {what} tasks ({path}) at policy {version} ...")
            t0 = time.monotonic()
            results = score_held_out(path, engine_url, run_dir, folder, o.parallelism, o.score_limit, last)
            scores = result.scores.setdefault(name, SetScores(name=name, path=str(path)))
            scores.add(tag, results)
            mean, se, n = scores.point(tag)
            if attr is not None:
                setattr(result, f"{attr}_{tag}", mean)
                setattr(result, f"{attr}_sessions", n)
            result.phase_s[f"score_{attr or name.replace('-', '_')}_{tag}"] = round(time.monotonic() - t0, 1)
            self.say(f"{what} reward ({name}) at policy {version}: {fmt(mean)} ±{fmt(se)} ({n} sessions)")
        if sets:
            with open(run_dir / "scores.json", "w") as f:  # every set's rewards per session so far (paired gains)
                json.dump({k: v.summary() | {"rewards": v.rewards} for k, v in result.scores.items()}, f)

    def _warm_start(self, policy: Any, engine_url: str, run_dir: Path, result: LoopResult) -> tuple[int, frozenset[str]]:
        """Demonstrations (recorded now through the job's harness, or found), the supervised warm start on their
        sampled tokens, its weights into the engine as policy 1; (that version, the demonstrated task ids)."""
        import torch

        from tracefleet.trainer import demos
        from tracefleet.trainer.control import update_policy
        from tracefleet.trainer.grpo import save_weights, sft, trainable

        o = self.o
        t0 = time.monotonic()
        if o.demos:
            self.say(f"recording {o.demos} demonstrations through the job's harness (the scripted engine) ...")
            found = demos.record(o.job_path, run_dir / "demos", o.demos, parallelism=o.parallelism, err=self.err)
            result.warm.update(demo_sessions=found.sessions, record_s=round(found.seconds, 1))
        else:
            found = demos.find(o.warm_start)  # type: ignore[arg-type]
        table = demos.rewarded(found)
        t, demonstrated = demos.tensors(table), demos.task_ids(table)
        if o.demo_mix:
            from tracefleet.api.manifest import load_job
            from tracefleet.trainer.demo_mix import DemoMix, row_kinds

            tasks = job_tasks(load_job(o.job_path), o.job_path.resolve().parent)
            self.demo_mix = DemoMix(t, row_kinds(demos.row_tasks(table), tasks))
        self.say(f"warm start on {int(t['input_ids'].shape[0])} demonstrations "
                 f"({int(t['loss_mask'].sum())} sampled tokens), {o.warm_epochs} epochs, lr {o.warm_lr:g} "
                 f"({o.warm_schedule}), "
                 f"{layers_text(o.warm_layers)} ...")
        t_sft = time.monotonic()
        stats = sft(policy, torch.optim.AdamW(trainable(policy), lr=o.warm_lr), t, epochs=o.warm_epochs,
                    seed=o.seed, decay=o.warm_schedule == "linear", log=self.say)
        sft_s = time.monotonic() - t_sft
        report = update_policy([engine_url], save_weights(policy, run_dir / "checkpoints" / "policy-1"), 1)
        result.warm.update(demos=stats["rows"], tokens=stats["tokens"], epochs=stats["epochs"], nll=stats["nll"],
                           layers=o.warm_layers, schedule=o.warm_schedule,
                           sft_s=round(sft_s, 1), sync_s=round(report.seconds, 3),
                           seconds=round(time.monotonic() - t0, 1))
        with open(run_dir / "warm-start.json", "w") as f:
            json.dump(result.warm, f)
        return 1, demonstrated

    def _summary(self, r: LoopResult) -> None:
        first, last = r.reward_rise()
        syncs = [s["sync_s"] for s in r.steps]
        mism = [s["mean_abs_dlogprob"] for s in r.steps if s.get("mean_abs_dlogprob") is not None]
        lines = [
            f"{len(r.steps)} steps in {r.wall_s / 60:.1f} min (engine start {r.startup_s:.0f} s), {r.sessions} sessions",
            f"batch reward: first two steps {fmt(first)}, last two {fmt(last)}"
            + (f" ({last - first:+.2f})" if first is not None and last is not None else ""),
        ]
        if r.warm:
            lines.append(f"warm start: {r.warm['demos']} demonstrations, {r.warm['tokens']} tokens, NLL per token "
                         f"{' -> '.join(f'{x:.3f}' for x in r.warm['nll'])} over {r.warm['epochs']} epochs "
                         f"({r.warm['schedule']} rate) on {layers_text(r.warm['layers'])} ({r.warm['seconds']:.0f} s in all)")
        for name, scores in r.scores.items():
            what = "train" if name == "train" else f"held-out ({name})"
            warm = f", {score_line(scores.point('warm'))} after the warm start" if r.warm else ""
            gain = f"; RL {score_line(scores.gain('warm' if r.warm else 'before', 'after'), signed=True)} paired"
            lines.append(f"{what} reward: {score_line(scores.point('before'))} at policy 0{warm}, "
                         f"{score_line(scores.point('after'))} after ({scores.point('after')[2]} sessions each){gain}")
        if r.kinds:
            lines.append("rollouts solved by kind: " + ", ".join(f"{k} {v['solved']}/{v['tried']}"
                                                                 for k, v in r.kinds.items()))
        if r.guided:
            by_calls = ", ".join(f"{n} with {k}" for k, n in r.guided["sessions_by_guided_calls"].items())
            lines.append(f"guided: {r.guided['guided_groups']} of {r.guided['groups']} groups; sessions by guided "
                         f"calls: {by_calls or 'none'}")
        if syncs:
            lines.append(f"weight sync: mean {sum(syncs) / len(syncs):.2f} s, max {max(syncs):.2f} s per step; "
                         f"train/inference mean |dlogprob| {sci(sum(mism) / len(mism) if mism else None)}")
        if r.flat:
            lines.append(f"{len(r.flat)} batches with no group of reward spread skipped (zero gradient)")
        lines.append(f"generation wasted by syncs: {r.calls_aborted} calls aborted, {r.tokens_aborted} tokens")
        lines.append(f"run folder: {r.run_dir} (loop.jsonl, batches/, checkpoints/, rollouts.log)")
        for line in lines:
            print(line, file=self.out, flush=True)


def served_model_dir(url: str) -> Path:
    """The directory a vLLM serves (its /v1/models `root`), which the trainer loads."""
    import httpx

    card = httpx.get(url + "/v1/models", timeout=10).raise_for_status().json()["data"][0]
    path = Path(card.get("root") or "")
    if not (path / "config.json").is_file():
        raise UsageError(f"the vLLM at {url} serves {card.get('root')!r}, not a model directory on this machine")
    return path


class GenerationHold:
    """The staleness bound on the producing side. While batch `seq` trains, the batches sealed after it are
    trained one version later each: the j-th behind it at a lag of j. Once `max_lag` of them wait, whatever the
    engine samples next would be older than the bound when its turn comes, and only masked; so from that moment
    the engine is paused (mode keep: the requests in flight are frozen, not lost) until the next update resumes
    it. Checked when a step starts and every `poll_s` while it trains (the trainer's step takes as long as
    producing a batch or longer, and a check at the start alone let rollouts run ahead). `max_lag` 0: the engine
    is paused for every step (on-policy). `every_step` (the `alternate` schedule): the engine is paused for every
    step whatever the backlog, the staleness bound unchanged (the tokens sampled before the pause are a version
    old once the update lands, and trained on within `max_lag` 1)."""

    def __init__(self, url: str, reader: Any, max_lag: int, poll_s: float = POLL_S, every_step: bool = False) -> None:
        self.url, self.reader, self.max_lag, self.poll_s, self.every_step = url, reader, max_lag, poll_s, every_step
        self.held = False
        self.holds = 0  # how often the engine was paused for the bound (not counting `every_step`'s pauses)

    def backlog(self, seq: int) -> int:
        return len([s for s in self.reader.seqs() if s > seq])

    def check(self, seq: int) -> None:
        if self.held:
            return
        bound = self.backlog(seq) >= self.max_lag
        if bound or self.every_step:
            self._engine_call("pause")
            self.held, self.holds = True, self.holds + bound

    @contextmanager
    def watching(self, seq: int) -> Iterator[None]:
        """`check(seq)` now and every poll_s until the block ends (the step's training)."""
        self.check(seq)
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(self.poll_s):
                self.check(seq)

        thread = threading.Thread(target=watch, name="generation-hold", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def updated(self) -> None:
        """The update resumed the engine."""
        self.held = False

    def release(self) -> None:
        """Resume the engine without an update (a step that trained nothing)."""
        if self.held:
            self._engine_call("resume")
            self.held = False

    def _engine_call(self, what: str) -> None:
        from tracefleet.trainer.control import EngineControl

        engine = EngineControl(self.url)
        try:
            engine.pause("keep") if what == "pause" else engine.resume()
        finally:
            engine.close()


def machine_threads() -> int:
    """The cores this process may run on (its affinity; a container's CPU set, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def step_threads(o: LoopOptions) -> int:
    """The trainer's torch threads for GRPO's steps: `--torch-threads`, else every core when each step has the
    machine to itself (`alternate`), else one beside the rollouts (TRAINER_THREADS)."""
    return o.torch_threads or (machine_threads() if o.schedule == "alternate" else TRAINER_THREADS)


def with_signal(t: dict[str, Any]) -> dict[str, Any] | None:
    """`t` with only the rows whose advantage is not 0 (their group had reward spread), cut to the longest of
    them; None when there is none. A row of advantage 0 adds nothing to the GRPO gradient (its objective is 0
    whatever the ratio) but costs a whole forward pass of a ~1.7k-token harness trace: leaving it out (with the
    loss still divided by the whole batch's trainable tokens: grpo_step's `tokens`) gives the same gradient."""
    from tracefleet.traces.reader import take_rows

    keep = t["sequence_advantages"] != 0
    if not keep.any():
        return None
    return t if keep.all() else take_rows(t, keep)


def positive_advantages(t: dict[str, Any]) -> dict[str, Any]:
    """`t` with every negative advantage (per token and per row) set to 0: a session below its group's mean then
    adds nothing to the gradient (with_signal leaves its row out), one above it keeps its advantage."""
    return {**t, "advantages": t["advantages"].clamp(min=0),
            "sequence_advantages": t["sequence_advantages"].clamp(min=0)}


def unsampled_trained_tokens(t: dict[str, Any]) -> int:
    """Tokens in the loss (loss_mask > 0) that no policy version sampled (token_versions -1): always 0 for
    the policy's own sessions, whose only trainable tokens are the engine's samples."""
    from tracefleet.traces.versions import NOT_SAMPLED

    return int(((t["loss_mask"] > 0) & (t["token_versions"] == NOT_SAMPLED)).sum())


def held_out_name(path: Path, paths: list[Path]) -> str:
    """A held-out set's name: its job's metadata.name (the file's stem when two jobs share a name)."""
    from tracefleet.api.manifest import load_job

    names = [load_job(p).name for p in paths]
    name = load_job(path).name
    return name if names.count(name) == 1 else path.stem


def prune_checkpoints(folder: Path, keep: int) -> None:
    ckpts = sorted(folder.glob("policy-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    for old in ckpts[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def stale_tokens(t: dict[str, Any], bound: int) -> int:
    """Sampled tokens the reader masked for being older than `bound`."""
    versions = t["token_versions"]
    return int(((versions >= 0) & (versions < bound)).sum())


def step_record(step: int, version: int, t: dict[str, Any], group_ids: list[str], stats: dict[str, Any], bound: int,
                report: Any, train_s: float, backlog: int) -> dict[str, Any]:
    """One step's figures (loop.jsonl)."""
    on = t["loss_mask"] > 0
    versions = t["token_versions"]
    masked = stale_tokens(t, bound)
    seen = versions[on]
    rewards = t["rewards"]
    by_group: dict[str, set[float]] = {}
    for g, r in zip(group_ids, rewards.tolist()):
        by_group.setdefault(g, set()).add(r)
    flight = report.in_flight
    return {
        "step": step, "version": version, "rows": int(t["input_ids"].shape[0]),
        "reward_mean": float(rewards.mean()) if rewards.numel() else None,
        "groups": len(by_group), "groups_with_signal": sum(len(v) > 1 for v in by_group.values()),
        "trainable_tokens": int(on.sum()), "stale_tokens_masked": masked,
        "max_lag_seen": int(version - 1 - int(seen.min())) if seen.numel() else 0,
        "backlog": backlog, "train_s": round(train_s, 3), **report.loop_figures(),
        "sync_steps": {k: round(v, 3) for k, v in report.step_seconds().items()},
        "kept": sum(f.kept for f in flight), "aborted": sum(f.aborted for f in flight),
        **{k: v for k, v in stats.items() if k != "tokens"},
        "mismatch_tokens": stats.get("tokens", 0),
    }


def run_loop(options: LoopOptions, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> LoopResult:
    return Loop(options, out, err).run()

