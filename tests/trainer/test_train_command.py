"""`tracefleet train` before it starts anything: the job it runs (the tasks repeated round after round, each
round its own GRPO group) and the one-line errors a user gets. The loop itself runs in bench/loop.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracefleet.api.manifest import load_job
from tracefleet.cli import main as cli_main
from tracefleet.contract.semantics import group_id, session_slots
from tracefleet.trainer.loop import repeated_job

REPO = Path(__file__).resolve().parents[2]
LOOP_JOB = REPO / "examples" / "loop" / "job.yaml"
HARNESS_JOB = REPO / "examples" / "harness-train" / "job.yaml"


def test_the_loop_job_repeats_the_tasks_in_rounds_each_its_own_group() -> None:
    job = load_job(LOOP_JOB)
    looped = repeated_job(job, LOOP_JOB.parent, rounds=3, traces_per_step=8)
    ids = [t.id for t in looped.spec.tasks.inline]
    assert ids == [f"{t}-r{k}" for k in range(3) for t in ("add", "shout", "total")]
    assert looped.spec.output.traces_per_batch == 8 and looped.spec.tasks.samples_per_task == 4
    assert looped.name == job.name and job.spec.tasks.inline[0].id == "add"  # the loaded job is unchanged
    slots = session_slots(looped.name, ids, 4)
    assert len({p.group_id for p in slots}) == 9 and slots[0].group_id == group_id("loop", "add-r0")
    assert [t.prompt for t in looped.spec.tasks.inline[3:6]] == [t.prompt for t in job.spec.tasks.inline]


def test_the_demonstrated_tasks_come_last_in_each_round() -> None:
    job = load_job(HARNESS_JOB)
    looped = repeated_job(job, HARNESS_JOB.parent, rounds=2, traces_per_step=None,
                          last=frozenset({"train-000", "train-001"}))
    ids = [t.id for t in looped.spec.tasks.inline]
    assert len(ids) == 400 and ids[:2] == ["train-002-r0", "train-003-r0"]
    assert ids[198:202] == ["train-000-r0", "train-001-r0", "train-002-r1", "train-003-r1"]
    assert looped.spec.output.traces_per_batch == 8 and looped.spec.tasks.samples_per_task == 4


def test_train_says_what_is_wrong_in_one_line(tmp_path: Path, capsys: Any) -> None:
    other = tmp_path / "job.yaml"
    other.write_text(LOOP_JOB.read_text().replace("model: smollm2", "model: Qwen/Qwen3-8B")
                     .replace("{job_dir}/../quickstart/", "../quickstart/")
                     .replace("../quickstart/", f"{LOOP_JOB.parent.parent}/quickstart/"))
    top_k, text = tmp_path / "top-k.yaml", HARNESS_JOB.read_text()
    assert "temperature: 1.0\n" in text  # the line topK is added after
    top_k.write_text(text.replace("temperature: 1.0", "temperature: 1.0\n      topK: 20")
                     .replace("uri: train.jsonl", f"uri: {HARNESS_JOB.parent / 'train.jsonl'}"))
    cases = [
        (["train", str(tmp_path / "missing.yaml")], "missing.yaml: no such file"),
        (["train", str(top_k)], "spec.inference.sampling.topK: tracefleet train scores tokens at their temperature only"),
        (["train", str(LOOP_JOB), "--max-lag", "-1"], "--max-lag must be 0 or more"),
        (["train", str(LOOP_JOB), "--minutes", "0"], "--minutes must be more than 0"),
        (["train", str(LOOP_JOB), "--output", "s3:/bad"], "--output s3:/bad: the run's folder on this machine"),
        (["train", str(other)], "trains a shipped model on this machine (smollm2); the job serves 'Qwen/Qwen3-8B'"),
        (["train", str(LOOP_JOB), "--held-out", str(tmp_path)], "is a directory"),
        (["train", str(LOOP_JOB), "--warm-start", str(tmp_path / "nothing")], "nothing: no such folder"),
        (["train", str(LOOP_JOB), "--warm-start", str(tmp_path)], "expected the sealed batches of one job"),
        (["train", str(LOOP_JOB), "--demos", "4"], "demonstrations are scripted for generated tasks"),
        (["train", str(HARNESS_JOB), "--demos", "4", "--warm-start", str(tmp_path)], "not allowed with argument"),
    ]
    for argv, message in cases:
        capsys.readouterr()
        try:
            assert cli_main(argv) == 2, argv
        except SystemExit as exc:  # argparse's own usage errors
            assert exc.code == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
