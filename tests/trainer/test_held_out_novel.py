"""The second held-out set of examples/harness-train (held-out-novel.jsonl, written by hand): worded unlike anything
the generator writes, over task shapes it never makes, with file names outside its pattern, and every task one the
judge scores by the workspace alone (the start earns 0, the expected end state 1)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from tracefleet.api.manifest import load_job
from tracefleet.contract.plan import read_tasks
from tracefleet.trainer import filetasks
from tracefleet.trainer.jobs import job_tasks

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "harness-train"
NOVEL = EXAMPLE / "held-out-novel.yaml"


def template_pattern(template: str) -> re.Pattern[str]:
    """A generator phrasing as a regex over whole prompts (its fields any text)."""
    return re.compile(re.sub(r"\\\{\w+\\\}", ".+", re.escape(template)) + "$")


def test_the_novel_set_is_worded_and_shaped_unlike_the_generator() -> None:
    job = load_job(NOVEL)
    tasks = job_tasks(job, EXAMPLE)
    assert len(tasks) * job.spec.tasks.samples_per_task >= 60  # sessions per checkpoint
    assert job.name != load_job(EXAMPLE / "held-out.yaml").name  # scored side by side, each under its name
    templates = [template_pattern(t) for t in filetasks.TEMPLATES]
    generated_name = re.compile(r"^[a-z]+[_-]?\d{1,2}\.(" + "|".join(filetasks.EXTENSIONS) + ")$")
    kinds = {t.metadata["kind"] for t in tasks}
    assert len(kinds) >= 10 and not kinds & set(filetasks.WIDE_KINDS), kinds
    train, held = filetasks.generate(seed=0, kinds=filetasks.WIDE_KINDS)
    generated_prompts = {t.prompt for t in train + held + [t for s in filetasks.generate(seed=0) for t in s]}
    for task in tasks:
        assert not any(p.match(task.prompt) for p in templates), task.prompt
        assert task.prompt not in generated_prompts
        expect = task.metadata["expect"]
        for name in [*expect["files"], *expect["absent"]]:
            assert not generated_name.match(Path(name).name), name
            # every file the judge checks is named in the prompt, or is one the task must leave as it was
            assert Path(name).name in task.prompt or name in task.metadata["start"], (task.id, name)


def test_the_judge_scores_each_novel_task_by_its_workspace(tmp_path: Path) -> None:
    for spec in read_tasks((EXAMPLE / "held-out-novel.jsonl").read_text(), "held-out-novel.jsonl"):
        ws = tmp_path / spec.id
        ws.mkdir()
        setup = (spec.model_dump().get("workspace") or {}).get("setup") or []
        for command in setup:
            subprocess.run(["sh", "-c", command], cwd=ws, check=True)
        ctx = {"task": {"id": spec.id, "metadata": spec.metadata}, "workdir": str(ws)}
        before = filetasks.judge(ctx)
        assert before["reward"] == 0.0 and before["problems"], (spec.id, before)
        expect = filetasks.Expect.model_validate(spec.metadata["expect"])
        for name in expect.absent:
            path = ws / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        for name, lines in expect.files.items():
            (ws / name).parent.mkdir(parents=True, exist_ok=True)
            (ws / name).write_text("".join(f"{line}\n" for line in lines))
        assert filetasks.judge(ctx) == {"reward": 1.0, "problems": []}, spec.id
