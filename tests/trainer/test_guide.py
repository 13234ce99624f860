"""Guided prefixes (tracefleet train --guide, tracefleet.trainer.guide): the rule that decides a group's guided calls,
the options that refuse a job it cannot guide, and the loop's rollouts guiding a `fix` group through the real Pi CLI:
the guide answers the read, the policy's engine the edit, and the sealed traces train on the policy's calls only."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tracefleet.api.manifest import load_job
from tracefleet.contract.plan import plan_sessions
from tracefleet.runner.local import job_tasks as run_tasks
from tracefleet.runner.services import start_cpu_engine
from tracefleet.traces import BatchReader
from tracefleet.trainer import filetasks
from tracefleet.trainer.guide import Guide, guided_calls, plan_length
from tracefleet.trainer.jobs import job_tasks, with_tasks
from tracefleet.trainer.loop import LoopOptions, Rollouts, run_loop
from tracefleet.trainer.task_sampler import TaskSampler
from tracefleet.usage import UsageError

from fixtures.harness_traces import session_records, trace_problems

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "harness-train"


def test_the_guide_withdraws_as_the_pass_rate_rises_and_never_makes_the_last_call() -> None:
    assert [guided_calls(2, p, 0.4) for p in (0.0, 0.1, 0.39, 0.4, 0.9)] == [1, 1, 1, 0, 0]
    assert [guided_calls(5, p, 0.4) for p in (0.0, 0.1, 0.2, 0.3, 0.4)] == [4, 3, 2, 1, 0]
    assert all(guided_calls(1, p, 1.0) == 0 for p in (0.0, 0.5))  # one call: always the policy's
    assert guided_calls(4, 0.0, 0.0) == 0  # off
    for length in range(1, 8):
        for p in (0.0, 0.05, 0.2, 0.33):
            k = guided_calls(length, p, 0.5)
            assert 0 <= k <= max(0, length - 1) and k == (0 if length < 2 else math.ceil(round((length - 1) * (1 - p / 0.5), 9)))


def test_only_fix_has_more_than_one_call_to_guide() -> None:
    tasks = filetasks.load_tasks(EXAMPLE / filetasks.TRAIN_FILE)
    by_kind = {t.kind: t for t in tasks}
    lengths = {kind: plan_length(t.spec()["metadata"], t.id, t.prompt, "pi") for kind, t in by_kind.items()}
    assert lengths == {"create": 1, "append": 1, "rename": 1, "fix": 2}
    assert plan_length(by_kind["fix"].spec()["metadata"], "x", by_kind["fix"].prompt, "codex") == 2


def test_a_group_is_guided_alike_and_decided_once() -> None:
    job = load_job(EXAMPLE / "job.yaml")
    guide = Guide(job, EXAMPLE, 0.5)
    fix = next(t for t in job_tasks(job, EXAMPLE) if (t.metadata or {}).get("kind") == "fix")
    one = with_tasks(job, [fix], 2, 2)
    plans = plan_sessions(one, run_tasks(one, EXAMPLE), "smollm2")
    first = guide.plan(plans[0], 0.1)
    second = guide.plan(plans[1], 0.9)  # the rate moved: the group keeps its first decision
    assert (first.guided_calls, second.guided_calls) == (1, 1)
    assert guide.groups.summary() == {"groups": 1, "guided_groups": 1, "sessions_by_guided_calls": {"1": 2}}


def test_guide_refuses_what_it_cannot_guide(tmp_path: Path) -> None:
    job = load_job(EXAMPLE / "job.yaml")
    with pytest.raises(UsageError, match=r"--guide must be a pass rate in \(0, 1\]"):
        Guide(job, EXAMPLE, 1.5)
    server = job.model_copy(deep=True)
    server.spec.inference.capture.mode = "server"
    with pytest.raises(UsageError, match="server mode the engine re-renders the guide's turns"):
        Guide(server, EXAMPLE, 0.5)
    quickstart = load_job(REPO / "examples" / "quickstart" / "job.yaml")
    with pytest.raises(UsageError, match="demonstrations are scripted for generated tasks"):
        Guide(quickstart, REPO / "examples" / "quickstart", 0.5)
    with pytest.raises(UsageError, match="--guide must be 0"):
        run_loop(LoopOptions(job_path=EXAMPLE / "job.yaml", guide=-0.1, output=tmp_path))


@pytest.mark.slow
def test_the_loops_rollouts_guide_a_fix_group_through_pi_and_train_only_on_the_policys_calls(
        harness_binaries: Any, tmp_path: Path) -> None:
    job_path = EXAMPLE / "job.yaml"
    job = load_job(job_path)
    fix = next(t for t in job_tasks(job, EXAMPLE) if (t.metadata or {}).get("kind") == "fix")
    task = filetasks.task_of(fix.metadata or {}, fix.id, fix.prompt)
    guide = Guide(job, EXAMPLE, 0.9)
    # the policy's engine: the scripted engine playing the same demonstration (from its second round on, here)
    (tmp_path / "policy.json").write_text(json.dumps(filetasks.demo_script([task])))
    policy = start_cpu_engine("smollm2", tmp_path / "policy.log", backend="scripted",
                              extra_args=["--script", str(tmp_path / "policy.json")])
    try:
        guide_url = guide.start(tmp_path)
        loop_job = with_tasks(job, [fix], 2, 2)
        rollouts = Rollouts(job_path, loop_job, policy.url, tmp_path / "batches", tmp_path / "work", 2,
                            tmp_path / "rollouts.log", TaskSampler("rounds", 2), guide, guide_url)
        assert rollouts.run.run() == 0, (tmp_path / "rollouts.log").read_text()[-3000:]
    finally:
        guide.stop()
        policy.stop()
    assert guide.groups.summary() == {"groups": 1, "guided_groups": 1, "sessions_by_guided_calls": {"1": 2}}
    reader = BatchReader(str(tmp_path / "batches"), loop_job.name)
    rows = [row for m in reader.batches() for row in reader.read(m).table.to_pylist()]
    assert len(rows) == 2 and all(r["reward"] == 1.0 for r in rows), [r["reward"] for r in rows]
    for row in rows:
        records = list(session_records(tmp_path / "work" / "capture", row["session_id"]).values())
        assert [r.guided for r in records] == [True, False, False]
        assert [r.engine_url for r in records] == [guide_url, policy.url, policy.url]
        calls = [(c["name"], json.loads(c["arguments"])) for r in records for c in (r.tool_calls or [])]
        assert calls == filetasks.pi_steps(task)  # the guide's read, then the policy's edit
        assert trace_problems(row, {r.call_id: r for r in records}) == []
        assert [s["call_id"] for s in row["spans"]] == [r.call_id for r in records[1:]]
        read = records[0]
        end = len(read.prompt_ids) + len(read.completion_ids)
        assert row["tokens"][:end] == read.prompt_ids + read.completion_ids and not any(row["loss_mask"][:end])
        assert row["num_trainable"] == sum(len(r.completion_ids) for r in records[1:])
