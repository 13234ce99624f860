"""The one planner (tracefleet.contract.plan): a tasks file read typed with a one-line error, the rules it holds once
(the Harbor agent's time limit, `{job_dir}` and relative task paths, the defaults), and the same plans from a tasks
file whichever driver reads it (the operator's ConfigMap/URI text, `tracefleet run`'s file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tracefleet.contract.harbor import TaskConfig
from tracefleet.contract.job import Evaluator, Harness, RolloutJob
from tracefleet.contract.plan import TasksFileError, harbor_task, plan_sessions, read_tasks
from tracefleet.contract.semantics import EVALUATOR_TIMEOUT_S, SESSION_TIMEOUT_S
from tracefleet.contract.session import EvaluatorSpec, HarnessConfig
from tracefleet.operator.plans import job_plans, job_tasks

TASKS = [{"id": "a", "prompt": "fix a", "workspace": {"repo": "repos/a", "setup": ["make"]}},
         {"id": "b", "prompt": "fix b", "testCommand": ["pytest", "-q"], "metadata": {"level": 2}}]
JOB = """
apiVersion: tracefleet.io/v1alpha1
kind: RolloutJob
metadata: {name: plan}
spec:
  inference: {external: {baseUrl: "http://127.0.0.1:9", model: m}}
  harness: {command: ["python", "{job_dir}/agent.py"], sessionTimeoutSeconds: 300, workspace: {setup: ["pip install ."]}}
  tasks: {uri: tasks.jsonl, samplesPerTask: 2}
  evaluator: {command: ["python", "-m", "pytest"]}
  output: {uri: out}
"""


def test_a_tasks_file_reads_typed_and_a_bad_line_is_one_line() -> None:
    text = "\n".join(json.dumps(t) for t in TASKS) + "\n\n"
    assert [(t.id, t.test_command) for t in read_tasks(text, "tasks.jsonl")] == [("a", None), ("b", ["pytest", "-q"])]
    for bad, message in (('{"id": "c"}', "tasks.jsonl: line 3: prompt: Field required"),
                         ("{oops", "tasks.jsonl: line 3: Invalid JSON")):
        with pytest.raises(TasksFileError) as err:
            read_tasks(text.rstrip() + "\n" + bad, "tasks.jsonl")
        assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_one_default_per_time_limit() -> None:
    assert Harness.model_fields["session_timeout_seconds"].default == HarnessConfig().timeout_s == SESSION_TIMEOUT_S
    assert Evaluator.model_fields["timeout_seconds"].default == EvaluatorSpec().timeout_s == EVALUATOR_TIMEOUT_S


def test_the_operator_and_tracefleet_run_plan_a_tasks_file_alike(tmp_path: Path) -> None:
    from tracefleet.runner.local import LocalOptions, LocalRun
    from tracefleet.runner.local import job_tasks as local_tasks

    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(t) for t in TASKS) + "\n")
    (tmp_path / "job.yaml").write_text(JOB)
    run = LocalRun(LocalOptions(job_path=tmp_path / "job.yaml"))
    here = run.plans(local_tasks(run.job, run.base_dir), "m")
    job = RolloutJob.model_validate(yaml.safe_load(JOB))
    shipped = job_plans(job, job_tasks(job, (tmp_path / "tasks.jsonl").read_text()))
    # the operator leaves the plan to be settled where it runs; settled at the same folder, it is the same plan
    assert [p.at(tmp_path) for p in shipped] == here
    a0 = here[0]
    assert (a0.session_id, a0.group_id, a0.harness.timeout_s, a0.evaluator.type) == ("plan-s0", "plan/a", 300, "command")
    assert a0.harness.command == ["python", f"{tmp_path}/agent.py"] and a0.task.repo == str(tmp_path / "repos" / "a")
    assert a0.task.setup == ["make", "pip install ."] and here[3].task.metadata == {"level": 2}
    assert shipped[0].harness.command == ["python", "{job_dir}/agent.py"] and shipped[0].task.repo == "repos/a"


def test_a_harbor_tasks_agent_limit_is_the_harness_limit_when_shorter() -> None:
    job = RolloutJob.model_validate(yaml.safe_load(JOB.replace("{uri: tasks.jsonl,", "{harbor: {uri: s3://bucket/tasks},")
                                                   .replace("  evaluator: {command: [\"python\", \"-m\", \"pytest\"]}\n", "")))
    tasks = [harbor_task(name, "do it", TaskConfig.model_validate({"agent": {"timeout_sec": limit}}), "s3://bucket/tasks")
             for name, limit in (("short", 60), ("long", 900))]
    plans = plan_sessions(job, tasks, None)
    assert [(p.task.id, p.harness.timeout_s, p.evaluator.type, p.model) for p in plans[::2]] == [
        ("short", 60, "harbor", "default"), ("long", 300, "harbor", "default")]
