"""Demonstrations recorded through the real harness, for a supervised warm start before GRPO.

A base model that never calls a tool through a harness gives GRPO no reward spread to learn from. The way off
zero that keeps every trained token honest: the scripted engine (tracefleet.engine.scripted) plays a correct
agent on each task (`filetasks.demo_script`: one route per task prompt, in the harness's own tool protocol), the
real CLI runs against it through the proxy in exact mode, and what is sealed is what any session seals: the
prompts exactly as the harness sent them, rendered by the model's own chat template, and completions that are the
model tokenizer's ids of the text the model family's tool-call format emits (`<tool_call>{json}</tool_call>` for
SmolLM2), which exact mode's own parser turned into the harness's tool calls. Only sessions the evaluator
rewarded are kept (`--accept reward>=1`: the judge read the workspace the demonstration left).

The warm start (tracefleet.trainer.grpo.sft) then trains on exactly those sealed tokens, the loss mask marking
the completions only: the tokens a policy must sample to act as the demonstration did.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from tracefleet.usage import UsageError

DEMO_SUFFIX = "-demos"
ACCEPT = "reward>=1"
DEMO_TRACES_PER_BATCH = 8
DEMO_ORDER = ("task_id", "sample_index", "trace_id")  # the warm start's row order, whatever order they sealed in


@dataclass
class DemoSet:
    folder: Path  # the sealed batches (a bucket directory)
    job: str  # their job name
    sessions: int = 0
    accepted: int = 0
    seconds: float = 0.0


def demo_tasks(job: Any, base_dir: Path, count: int) -> list[Any]:
    """The first `count` of the job's tasks (TaskSpec), each a generated task a script can solve."""
    from tracefleet.trainer.filetasks import FAMILY
    from tracefleet.trainer.jobs import job_tasks

    tasks = job_tasks(job, base_dir)[:count]
    plain = [t.id for t in tasks if (t.metadata or {}).get("family") != FAMILY]
    if plain:
        raise UsageError(f"demonstrations are scripted for generated tasks ({FAMILY}: python -m "
                         f"tracefleet.trainer.filetasks); these are not: {', '.join(plain[:5])}")
    return tasks


def start_script_engine(job: Any, tasks: list[Any], script_path: Path, log: Path,
                        script: dict[str, Any] | None = None) -> Any:
    """The scripted engine playing a correct agent on `tasks` (TaskSpec) in the job's harness (`demo_script`, or
    `script`), its script written at `script_path`: the demonstrations' engine, and the guide's
    (tracefleet.trainer.guide)."""
    from tracefleet.contract.plan import harness_config
    from tracefleet.runner.services import start_cpu_engine
    from tracefleet.trainer.filetasks import demo_script, task_of
    from tracefleet.trainer.jobs import trained_model

    if script is None:
        script = demo_script([task_of(t.metadata or {}, t.id, t.prompt) for t in tasks], harness_config(job).preset)
    script_path.write_text(json.dumps(script))
    return start_cpu_engine(trained_model(job), log, backend="scripted", extra_args=["--script", str(script_path)])


def record(job_path: Path, out: Path, count: int, *, parallelism: int | None = None, script: dict[str, Any] | None = None,
           err: TextIO = sys.stderr) -> DemoSet:
    """Record `count` demonstrations of the job's first tasks through its harness into `out`/batches (`script`:
    the scripted engine's, instead of the correct agent's `demo_script`)."""
    from tracefleet.api.manifest import load_job
    from tracefleet.runner.local import LocalOptions, LocalRun
    from tracefleet.trainer.jobs import with_tasks

    job = load_job(job_path)
    base_dir = job_path.resolve().parent
    tasks = demo_tasks(job, base_dir, count)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{job.name}{DEMO_SUFFIX}"
    demo_job = with_tasks(job, tasks, 1, DEMO_TRACES_PER_BATCH, name=name)
    t0 = time.monotonic()
    engine = start_script_engine(job, tasks, out / "script.json", out / "scripted-engine.log", script)
    try:
        with open(out / "record.log", "a") as log:
            run = LocalRun(LocalOptions(job_path=job_path, output=str(out / "batches"), engine_url=engine.url,
                                        work_dir=out / "work", parallelism=parallelism, accept=ACCEPT,
                                        progress_interval_s=30.0), out=log, summary=log)
            run.job = demo_job
            run.run()
    finally:
        engine.stop()
    rewards = [r.result.reward for r in run.results]
    demos = DemoSet(folder=out / "batches", job=name, sessions=len(rewards), accepted=sum(r >= 1 for r in rewards),
                    seconds=time.monotonic() - t0)
    print(f"tracefleet train: {demos.accepted} of {demos.sessions} demonstrations rewarded and kept "
          f"({demos.seconds:.0f} s; {out / 'record.log'})", file=err, flush=True)
    return demos


def find(folder: Path) -> DemoSet:
    """A folder of demonstrations `record` made (its batches' job is the one job under it)."""
    batches = folder / "batches" if (folder / "batches").is_dir() else folder
    jobs = sorted(p.name for p in batches.iterdir() if (p / "batches").is_dir()) if batches.is_dir() else []
    if len(jobs) != 1:
        raise UsageError(f"--warm-start {folder}: expected the sealed batches of one job (a folder `tracefleet train "
                         f"--demos` or `python -m tracefleet.trainer.demos` wrote), found {jobs or 'none'}")
    return DemoSet(folder=batches, job=jobs[0])


def task_ids(table: Any) -> frozenset[str]:
    """The ids of the tasks the demonstrations in `table` (`rewarded`'s) solved."""
    return frozenset(table.column("task_id").to_pylist())


def tensors(table: Any) -> dict[str, Any]:
    """The demonstrations in `table` (`rewarded`'s) as one padded batch (the reader's tensors), in its order."""
    from tracefleet.traces.reader import padded_tensors

    # the scripted engine's logprobs are stand-ins; supervised training reads only tokens and masks
    return padded_tensors(table, advantages=[1.0] * table.num_rows, allow_raw_logprobs=True)


def row_tasks(table: Any) -> list[str]:
    """The task id of each of `tensors(table)`'s rows, in the same order."""
    return table.column("task_id").to_pylist()


def rewarded(demos: DemoSet) -> Any:
    """The sealed demonstrations the evaluator rewarded, their training table in DEMO_ORDER: read once, the table
    `tensors`, `row_tasks` and `task_ids` take."""
    import pyarrow as pa

    from tracefleet.traces import BatchReader

    reader = BatchReader(str(demos.folder), demos.job, consumer="warm-start")
    tables = [reader.read(m).training_table() for m in reader.batches()]
    table = pa.concat_tables(tables, promote_options="default") if tables else None
    if table is None or not table.num_rows:
        raise UsageError(f"no sealed demonstrations in {demos.folder}")
    rewards = table.column("reward").to_pylist()
    table = table.take(pa.array([i for i, r in enumerate(rewards) if r is not None and r >= 1], pa.int64()))
    # sealed in the order the sessions finished, which differs run to run; in task order (trace ids are the
    # session's, made from the job: a total order) the warm start's rows, so its shuffle for a seed and its
    # weights, are the same whenever the demonstrations are
    return table.sort_by([(key, "ascending") for key in DEMO_ORDER])


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m tracefleet.trainer.demos", description=__doc__.splitlines()[0])
    p.add_argument("job", type=Path, help="the training job (generated tasks, any harness preset)")
    p.add_argument("--out", type=Path, required=True, help="folder for the sealed demonstrations")
    p.add_argument("--count", type=int, default=32)
    p.add_argument("--parallelism", type=int)
    a = p.parse_args(argv)
    demos = record(a.job, a.out, a.count, parallelism=a.parallelism)
    print(f"{demos.accepted} demonstrations in {demos.folder} (job {demos.job})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
