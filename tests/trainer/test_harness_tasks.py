"""The generated task family for training through a real harness (tracefleet.trainer.filetasks) and the
demonstrations recorded through the real Pi CLI (tracefleet.trainer.demos): disjoint splits, a judge that reads
the workspace and never the transcript, and demonstration traces whose trainable tokens are exactly the tokens the
engine sampled, in Pi's own tool protocol as exact mode parsed it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tracefleet.api.manifest import load_job
from tracefleet.engine.scripted import scripted_backend_for
from tracefleet.formats.shell_tools import COMMAND_KEYS
from tracefleet.runner.presets import get_preset
from tracefleet.traces import BatchReader
from tracefleet.trainer import demos, filetasks
from tracefleet.trainer.demo_mix import DemoMix, row_kinds
from tracefleet.trainer.filetasks import FileTask, generate, shell_commands, verdict
from tracefleet.trainer.jobs import job_tasks

from fixtures.harness_traces import session_records, trace_problems

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "harness-train"


def test_the_family_has_disjoint_train_and_held_out_instances_and_the_example_is_generated() -> None:
    train, held = generate(seed=0)
    assert len(train) >= 200 and len(held) >= 60  # sessions per scored point (one sample each)
    assert {t.kind for t in train} == {t.kind for t in held} == set(filetasks.KINDS)

    def names(tasks: list[FileTask]) -> set[str]:
        return {n for t in tasks for n in (t.file, t.new_file) if n}

    assert not names(train) & names(held) and not {t.prompt for t in train} & {t.prompt for t in held}
    assert len({t.prompt for t in train + held}) == len(train) + len(held)
    assert [t.prompt for t in generate(seed=0)[0]] == [t.prompt for t in train]  # seeded
    assert [t.prompt for t in generate(seed=1)[0]] != [t.prompt for t in train]
    # the checked-in example is what the generator writes (python -m tracefleet.trainer.filetasks examples/harness-train)
    for name, tasks in ((filetasks.TRAIN_FILE, train), (filetasks.HELD_OUT_FILE, held)):
        assert (EXAMPLE / name).read_text() == "".join(json.dumps(t.spec()) + "\n" for t in tasks), name
        assert [t.prompt for t in filetasks.load_tasks(EXAMPLE / name)] == [t.prompt for t in tasks]


def sh(command: str, cwd: Path) -> None:
    subprocess.run(["sh", "-c", command], cwd=cwd, check=True)


def test_the_wide_family_adds_its_kinds_and_keeps_the_splits_apart() -> None:
    train, held = generate(seed=0, kinds=filetasks.WIDE_KINDS)
    assert {t.kind for t in train} == {t.kind for t in held} == set(filetasks.WIDE_KINDS)
    names = [{n for t in split for n in (t.file, t.new_file) if n} for split in (train, held)]
    assert not names[0] & names[1] and len({t.prompt for t in train + held}) == len(train) + len(held)
    for task in train + held:  # each kind's end state differs from its start: doing nothing earns 0
        assert task.start != task.expect.files or task.expect.absent, task
    assert generate(seed=0, kinds=filetasks.KINDS) == generate(seed=0)  # the example's four, drawn as before


def test_the_judge_reads_the_workspace_it_is_given(tmp_path: Path) -> None:
    train, _ = generate(seed=0, kinds=filetasks.WIDE_KINDS)
    for task in train[:2 * len(filetasks.WIDE_KINDS)]:  # two of each kind
        ws = tmp_path / task.id
        ws.mkdir()
        for command in task.spec().get("workspace", {}).get("setup", []):
            sh(command, ws)
        before = verdict(task.expect, ws)
        assert before["reward"] == 0.0 and before["problems"], (task.kind, before)
        for command in shell_commands(task):
            sh(command, ws)
        assert verdict(task.expect, ws) == {"reward": 1.0, "problems": []}, (task.kind, task.prompt)
        ctx = {"task": {"id": task.id, "metadata": task.spec()["metadata"]}, "workdir": str(ws)}
        assert filetasks.judge(ctx)["reward"] == 1.0
    with pytest.raises(ValueError, match="not a workspace-files task"):
        filetasks.judge({"task": {"id": "x", "metadata": {}}, "workdir": str(tmp_path)})


def completion_text_is_canonical(tokenizer: Any, ids: list[int]) -> bool:
    """The completion (without its end-of-turn token) is what the tokenizer makes of its own text."""
    body = ids[:-1]
    return tokenizer.encode(tokenizer.decode(body, skip_special_tokens=False), add_special_tokens=False) == body


def sealed_rows(found: demos.DemoSet) -> list[dict[str, Any]]:
    """Every sealed row of the demonstrations, as a trainer reads them."""
    reader = BatchReader(str(found.folder), found.job)
    return [row for m in reader.batches() for row in reader.read(m).table.to_pylist()]


def wide_job(tmp_path: Path) -> tuple[Path, list[FileTask]]:
    """The example job on the wide family's train tasks (one of each kind first)."""
    write_dir = tmp_path / "wide"
    filetasks.write(write_dir, kinds=filetasks.WIDE_KINDS)
    job = (EXAMPLE / "job.yaml").read_text()
    (write_dir / "job.yaml").write_text(job)
    return write_dir / "job.yaml", filetasks.load_tasks(write_dir / filetasks.TRAIN_FILE)


@pytest.mark.slow
def test_demonstrations_through_pi_are_rewarded_only_for_the_work_and_train_on_sampled_tokens(
        harness_binaries: Any, tmp_path: Path) -> None:
    """One demonstration of each kind of the wide family (the example's four among them), plus a session that only
    claims the work."""
    job, wide = wide_job(tmp_path)
    kinds = len(filetasks.WIDE_KINDS)
    tasks = wide[:kinds + 1]
    script = filetasks.demo_script(tasks[:kinds])
    # the last session only claims the work: its final answer says it is done, no tool is called
    script["routes"].append({"marker": tasks[kinds].prompt, "commands": [], "steps": [],
                             "final_text": f"Created {tasks[kinds].file} with the text you asked for."})
    found = demos.record(job, tmp_path / "demos", kinds + 1, script=script)
    assert (found.sessions, found.accepted) == (kinds + 1, kinds), \
        (tmp_path / "demos" / "record.log").read_text()[-3000:]

    tokenizer = scripted_backend_for("smollm2").tokenizer
    rows = sealed_rows(found)
    assert sorted(r["task_id"] for r in rows) == sorted(t.id for t in tasks[:kinds])  # accepted ones only
    by_id = {t.id: t for t in tasks}
    for row in rows:
        records = session_records(tmp_path / "demos" / "work" / "capture", row["session_id"])
        assert trace_problems(row, records) == [], row["task_id"]
        assert len(records) == len(row["spans"]) == len(filetasks.pi_steps(by_id[row["task_id"]])) + 1  # one chain
        calls = [(c["name"], json.loads(c["arguments"])) for r in records.values() for c in (r.tool_calls or [])]
        assert calls == filetasks.pi_steps(by_id[row["task_id"]])  # exact mode parsed Pi's own tool calls
        assert all(completion_text_is_canonical(tokenizer, r.completion_ids) for r in records.values())

    table = demos.rewarded(found)
    assert demos.task_ids(table) == {t.id for t in tasks[:kinds]}  # what the loop puts last in each round
    t = demos.tensors(table)
    assert int(t["loss_mask"].sum()) == sum(row["num_trainable"] for row in rows)
    # --demo-mix: each GRPO step's demonstrations are one of every kind, each row's kind its task's
    specs = job_tasks(load_job(job), job.parent)  # the job's tasks, as the loop reads them
    kinds_of_rows = row_kinds(demos.row_tasks(table), specs)
    mix = DemoMix(t, kinds_of_rows)
    picked = mix.indices(0)
    assert sorted(kinds_of_rows[i] for i in picked) == sorted(filetasks.WIDE_KINDS)
    assert mix.rows(0)["loss_mask"].sum(dim=1).tolist() == t["loss_mask"][picked].sum(dim=1).tolist()


def command_of(arguments: dict[str, Any]) -> str:
    """The command a shell tool's arguments carry: a string, or the last word of an argv (`bash -lc COMMAND`)."""
    value = next(v for k, v in arguments.items() if k.lower() in COMMAND_KEYS)
    return value if isinstance(value, str) else value[-1]


@pytest.mark.slow
def test_demonstrations_through_codex_run_the_plan_in_its_shell_tool_and_train_on_sampled_tokens(
        harness_binaries: Any, tmp_path: Path) -> None:
    """The second CLI of the recipe (examples/harness-train/job-codex.yaml): the same tasks through Codex, the plan as
    shell commands in Codex's own shell tool, the same judge; the trainable tokens are exactly what was sampled."""
    job = EXAMPLE / "job-codex.yaml"
    tasks = filetasks.load_tasks(EXAMPLE / filetasks.TRAIN_FILE)[:4]  # one of each kind
    assert {t.kind for t in tasks} == set(filetasks.KINDS)
    found = demos.record(job, tmp_path / "demos", 4)
    assert (found.sessions, found.accepted) == (4, 4), (tmp_path / "demos" / "record.log").read_text()[-3000:]

    tokenizer = scripted_backend_for("smollm2").tokenizer
    shell = get_preset("codex").shell_tool
    rows = sealed_rows(found)
    by_id = {t.id: t for t in tasks}
    for row in rows:
        task = by_id[row["task_id"]]
        records = session_records(tmp_path / "demos" / "work" / "capture", row["session_id"])
        assert trace_problems(row, records) == [], row["task_id"]
        assert len(records) == len(row["spans"]) == len(shell_commands(task)) + 1  # one chain
        calls = [c for r in records.values() for c in (r.tool_calls or [])]
        assert [c["name"] for c in calls] == [shell] * len(shell_commands(task))
        assert [command_of(json.loads(c["arguments"])) for c in calls] == shell_commands(task), task.kind
        assert all(completion_text_is_canonical(tokenizer, r.completion_ids) for r in records.values())
    t = demos.tensors(demos.rewarded(found))
    assert int(t["loss_mask"].sum()) == sum(row["num_trainable"] for row in rows)
