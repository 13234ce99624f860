"""A generated family of small workspace tasks for training through a real coding harness.

Each instance asks for one change a coding harness makes with its own tools: create a file with given
content, append a line to a file, rename a file, or change one line of a file (`KINDS`, the example's). `WIDE_KINDS`
adds shapes that take other commands or more rounds: sort a file's lines, reverse them, put one line in capitals,
create two files, rename a file and then append to it (none of them a shape of the second held-out set,
examples/harness-train/held-out-novel.jsonl). Names, contents and wording
are drawn per instance from a seeded RNG; train and held-out instances draw file names from disjoint pools,
so no held-out file name, and no held-out prompt, is ever trained on.

Judging reads the workspace only (`judge`, a `hook` evaluator: `tracefleet.trainer.filetasks:judge`): the
expected end state is in the task's metadata (`expect`: files and their lines, files that must be gone),
never in the workspace, and the transcript is never read, so an answer that only claims the work earns 0.

A correct agent's plan for each instance (`pi_steps`: Pi's own tools read/bash/edit/write with their
arguments; `shell_commands`: one shell command per step, for any preset's shell tool) is what the scripted
engine plays to record demonstrations through the real CLI (`demo_script`).

    python -m tracefleet.trainer.filetasks OUT_DIR [--seed 0] [--train 200] [--held-out 60] [--kinds create ...]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field

FAMILY = "workspace-files"
Kind = Literal["create", "append", "rename", "fix", "sort", "reverse", "upper", "create-two", "rename-append"]
WIDE_KINDS: tuple[str, ...] = get_args(Kind)
KINDS = WIDE_KINDS[:4]  # the example's: create, append, rename, fix
TRAIN_FILE = "train.jsonl"
HELD_OUT_FILE = "held-out.jsonl"
JUDGE_HOOK = "tracefleet.trainer.filetasks:judge"
ROUND_SEP = "-r"  # the loop's repeated task ids (tracefleet.trainer.loop.ROUND_SEP)

STEMS = (
    "notes todo plan ideas draft memo report summary journal log list config settings readme changes agenda "
    "budget recipe schedule inventory contacts tasks goals outline review minutes letter story poem quotes "
    "links names colors fruits animals cities songs books movies games tools parts orders items results scores "
    "events dates places words terms facts steps rules hints tips errors issues bugs fixes features options "
    "params values limits ports hosts users groups roles teams projects modules files paths queries"
).split()
EXTENSIONS = ("txt", "md", "cfg", "ini", "log")
WORDS = (
    "apple river stone cloud green blue orange silver quiet bright early late north south east west spring "
    "summer winter autumn table chair window garden forest ocean mountain valley yellow purple small large "
    "happy calm brave clever gentle rapid slow warm cold fresh sweet bitter paper pencil lamp door bridge "
    "tower castle island desert meadow harbor planet comet rocket engine signal pixel vector matrix kernel"
).split()
KEYS = "mode level color size limit name owner region theme timeout retries format language port".split()

CREATE = (
    "Create the file {file} containing the text: {text}",
    "Make a new file named {file} whose content is: {text}",
    "Write a file {file} with this exact text: {text}",
    "Please create {file} and put the following text in it: {text}",
)
APPEND = (
    "Append the line '{line}' to the end of {file}.",
    "Add the line '{line}' at the end of the file {file}.",
    "At the bottom of {file}, add a new line: '{line}'.",
    "Extend {file} with one more final line: '{line}'.",
)
RENAME = (
    "Rename the file {file} to {new}.",
    "Move {file} to the new name {new}.",
    "Change the name of {file} to {new}, keeping its content.",
    "The file {file} should be called {new}. Rename it.",
)
FIX = (
    "In {file}, change the line '{old}' to '{new}'.",
    "Fix {file}: the line '{old}' must read '{new}'.",
    "Edit {file} so that the line '{old}' becomes '{new}'.",
    "In the file {file}, replace the line '{old}' with '{new}'.",
)
SORT = (
    "Sort the lines of {file} in alphabetical order.",
    "Reorder {file} so that its lines are sorted alphabetically.",
    "Put the lines of {file} in A to Z order.",
    "Arrange the lines in {file} alphabetically, in place.",
)
REVERSE = (
    "Reverse the order of the lines in {file}.",
    "Flip {file} upside down: its last line first, its first line last.",
    "Rewrite {file} with its lines in reverse order.",
    "Turn the line order of {file} around, the bottom line on top.",
)
UPPER = (
    "In {file}, put the line '{old}' in capital letters.",
    "Make the line '{old}' of {file} all uppercase.",
    "Capitalize every letter of the line '{old}' in {file}.",
    "In the file {file}, the line '{old}' should be written in upper case.",
)
CREATE_TWO = (
    "Create two files: {file} containing '{line}' and {new_file} containing '{new}'.",
    "Make {file} with the text '{line}', and also {new_file} with the text '{new}'.",
    "Write two new files, {file} that says '{line}' and {new_file} that says '{new}'.",
    "I need {file} holding '{line}' plus {new_file} holding '{new}'. Create both.",
)
RENAME_APPEND = (
    "Rename {file} to {new_file}, then append the line '{line}' to it.",
    "Move {file} to {new_file} and add the line '{line}' at its end.",
    "First rename {file} as {new_file}; then add a last line '{line}' to it.",
    "Give {file} the new name {new_file} and extend it with the line '{line}'.",
)
TEMPLATES = (*CREATE, *APPEND, *RENAME, *FIX, *SORT, *REVERSE, *UPPER, *CREATE_TWO, *RENAME_APPEND)


class Expect(BaseModel):
    """The workspace's end state that earns reward 1: each file's lines (trailing blanks ignored), and the
    files that must not exist."""

    files: dict[str, list[str]] = Field(default_factory=dict)
    absent: list[str] = Field(default_factory=list)


class FileTask(BaseModel):
    """One instance, with what `judge`, `pi_steps` and `shell_commands` need (its task metadata)."""

    id: str
    kind: Kind
    prompt: str
    start: dict[str, list[str]] = Field(default_factory=dict)  # files in the workspace before the session
    expect: Expect
    file: str
    new_file: str | None = None  # rename, rename-append: the new name; create-two: the second file
    line: str | None = None  # create, create-two: the (first file's) text; append, rename-append: the line
    old: str | None = None  # fix, upper: the line to change
    new: str | None = None  # fix, upper: what it becomes; create-two: the second file's text

    def spec(self) -> dict[str, Any]:
        """The RolloutJob task (one JSON line of spec.tasks.uri)."""
        setup = [f"printf '%s\\n' {' '.join(shell_quote(x) for x in lines)} > {shell_quote(name)}"
                 for name, lines in self.start.items()]
        task: dict[str, Any] = {"id": self.id, "prompt": self.prompt,
                                "metadata": {"family": FAMILY, **self.model_dump(exclude={"id", "prompt"})}}
        if setup:
            task["workspace"] = {"setup": setup}
        return task


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def phrase(rng: random.Random, lo: int = 2, hi: int = 4) -> str:
    return " ".join(rng.sample(WORDS, rng.randint(lo, hi)))


def filler_lines(rng: random.Random, n: int) -> list[str]:
    keys = rng.sample(KEYS, n)
    return [f"{k} = {rng.choice(WORDS)}" for k in keys]


def word_lines(rng: random.Random, order: Any) -> list[str]:
    """3-5 distinct lowercase words (the same order in every locale's `sort`), in an order `order` would change."""
    while True:
        lines = rng.sample(WORDS, rng.randint(3, 5))
        if order(lines) != lines:
            return lines


class Names:
    """Unique file names from one pool of stems (each name used once across a split)."""

    def __init__(self, rng: random.Random, stems: list[str]) -> None:
        self.rng, self.stems, self.used = rng, stems, set()

    def take(self) -> str:
        while True:
            stem = self.rng.choice(self.stems)
            name = f"{stem}{self.rng.choice(['', '_', '-'])}{self.rng.randint(1, 99)}.{self.rng.choice(EXTENSIONS)}"
            if name not in self.used:
                self.used.add(name)
                return name


def make_task(rng: random.Random, names: Names, kind: str, task_id: str) -> FileTask:
    file = names.take()
    if kind == "create":
        text = phrase(rng)
        return FileTask(id=task_id, kind="create", prompt=rng.choice(CREATE).format(file=file, text=text),
                        expect=Expect(files={file: [text]}), file=file, line=text)
    if kind == "append":
        lines, line = filler_lines(rng, rng.randint(1, 3)), phrase(rng)
        return FileTask(id=task_id, kind="append", prompt=rng.choice(APPEND).format(file=file, line=line),
                        start={file: lines}, expect=Expect(files={file: [*lines, line]}), file=file, line=line)
    if kind == "rename":
        lines, new_file = [phrase(rng)], names.take()
        return FileTask(id=task_id, kind="rename", prompt=rng.choice(RENAME).format(file=file, new=new_file),
                        start={file: lines}, expect=Expect(files={new_file: lines}, absent=[file]), file=file,
                        new_file=new_file)
    if kind in ("fix", "upper"):  # one line of the file changed: to another value, or to capitals
        lines = filler_lines(rng, rng.randint(2, 4))
        at = rng.randrange(len(lines))
        key, value = lines[at].split(" = ")
        new = f"{key} = {rng.choice([w for w in WORDS if w != value])}" if kind == "fix" else lines[at].upper()
        fixed = [*lines[:at], new, *lines[at + 1:]]
        return FileTask(id=task_id, kind=kind, prompt=rng.choice(FIX if kind == "fix" else UPPER).format(
                            file=file, old=lines[at], new=new),
                        start={file: lines}, expect=Expect(files={file: fixed}), file=file, old=lines[at], new=new)
    return wide_task(rng, names, kind, task_id, file)


def wide_task(rng: random.Random, names: Names, kind: str, task_id: str, file: str) -> FileTask:
    """An instance of one of WIDE_KINDS' added shapes (`upper` is made beside `fix`)."""
    if kind in ("sort", "reverse"):
        order = sorted if kind == "sort" else (lambda lines: lines[::-1])
        lines = word_lines(rng, order)
        return FileTask(id=task_id, kind=kind, prompt=rng.choice(SORT if kind == "sort" else REVERSE).format(file=file),
                        start={file: lines}, expect=Expect(files={file: order(lines)}), file=file)
    if kind == "create-two":
        second, text, other = names.take(), phrase(rng), phrase(rng)
        return FileTask(id=task_id, kind="create-two",
                        prompt=rng.choice(CREATE_TWO).format(file=file, line=text, new_file=second, new=other),
                        expect=Expect(files={file: [text], second: [other]}), file=file, line=text,
                        new_file=second, new=other)
    if kind == "rename-append":
        lines, new_file, line = [phrase(rng)], names.take(), phrase(rng)
        return FileTask(id=task_id, kind="rename-append",
                        prompt=rng.choice(RENAME_APPEND).format(file=file, new_file=new_file, line=line),
                        start={file: lines}, expect=Expect(files={new_file: [*lines, line]}, absent=[file]),
                        file=file, new_file=new_file, line=line)
    raise ValueError(f"no task kind {kind!r}: one of {', '.join(WIDE_KINDS)}")


def generate(seed: int = 0, train: int = 200, held_out: int = 60,
             kinds: tuple[str, ...] = KINDS) -> tuple[list[FileTask], list[FileTask]]:
    """(train, held-out): disjoint file-name pools, `kinds` in turn, every prompt distinct and none inside
    another (the scripted engine tells sessions apart by their prompt)."""
    rng = random.Random(seed)
    stems = list(STEMS)
    rng.shuffle(stems)
    cut = len(stems) * 4 // 5
    splits = []
    for prefix, count, pool in (("train", train, stems[:cut]), ("held", held_out, stems[cut:])):
        names = Names(rng, pool)
        splits.append([make_task(rng, names, kinds[i % len(kinds)], f"{prefix}-{i:03d}") for i in range(count)])
    prompts = [t.prompt for s in splits for t in s]
    assert not any(a != b and a in b for a in prompts for b in prompts), "a prompt is part of another"
    return splits[0], splits[1]


def write(out: Path, seed: int = 0, train: int = 200, held_out: int = 60,
          kinds: tuple[str, ...] = KINDS) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, tasks in zip((TRAIN_FILE, HELD_OUT_FILE), generate(seed, train, held_out, kinds)):
        path = out / name
        path.write_text("".join(json.dumps(t.spec()) + "\n" for t in tasks))
        paths.append(path)
    return paths[0], paths[1]


def task_of(metadata: dict[str, Any], task_id: str, prompt: str) -> FileTask:
    fields = {k: v for k, v in metadata.items() if k != "family" and k in FileTask.model_fields}
    return FileTask.model_validate({**fields, "id": task_id, "prompt": prompt})


def load_tasks(path: Path) -> list[FileTask]:
    """The FileTasks of a tasks file `write` made (read as every tasks file is: tracefleet.contract.plan.read_tasks)."""
    from tracefleet.contract.plan import read_tasks

    return [task_of(spec.metadata or {}, spec.id, spec.prompt) for spec in read_tasks(path.read_text(), str(path))]


# ---------------------------------------------------------------- judging (the workspace, never the transcript)


def file_lines(path: Path) -> list[str] | None:
    if not path.is_file():
        return None
    lines = [line.rstrip() for line in path.read_text(errors="replace").splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def verdict(expect: Expect, workdir: Path) -> dict[str, Any]:
    """Reward 1 when every expected file holds its lines and every absent one is gone, else 0 (with why)."""
    problems = []
    for name, lines in expect.files.items():
        got = file_lines(workdir / name)
        if got is None:
            problems.append(f"{name} is missing")
        elif got != lines:
            problems.append(f"{name} holds {got[:6]!r}, not {lines!r}")
    problems += [f"{name} still exists" for name in expect.absent if (workdir / name).exists()]
    return {"reward": 0.0 if problems else 1.0, "problems": problems}


def judge(ctx: dict[str, Any]) -> dict[str, Any]:
    """The hook evaluator (`evaluator: {preset: hook, entryPoint: tracefleet.trainer.filetasks:judge}`): the
    task's `expect` against the session's workspace."""
    metadata = (ctx.get("task") or {}).get("metadata") or {}
    if metadata.get("family") != FAMILY:
        raise ValueError(f"task {ctx.get('task', {}).get('id')!r} is not a {FAMILY} task (no metadata.expect)")
    return verdict(Expect.model_validate(metadata["expect"]), Path(ctx["workdir"]))


# ---------------------------------------------------------------- a correct agent's plan (demonstrations)


def pi_steps(task: FileTask) -> list[tuple[str, dict[str, Any]]]:
    """(tool, arguments) per round in Pi's own tools (read, bash, edit, write)."""
    if task.kind == "create":
        return [("write", {"path": task.file, "content": f"{task.line}\n"})]
    if task.kind == "append":
        return [("bash", {"command": f"echo {shell_quote(task.line or '')} >> {task.file}"})]
    if task.kind == "rename":
        return [("bash", {"command": f"mv {task.file} {task.new_file}"})]
    if task.kind in ("fix", "upper"):
        return [("read", {"path": task.file}),
                ("edit", {"path": task.file, "edits": [{"oldText": task.old, "newText": task.new}]})]
    if task.kind == "create-two":
        return [("write", {"path": task.file, "content": f"{task.line}\n"}),
                ("write", {"path": task.new_file, "content": f"{task.new}\n"})]
    return [("bash", {"command": command}) for command in shell_commands(task)]  # sort, reverse, rename-append


def shell_commands(task: FileTask) -> list[str]:
    """The same plan as shell commands, for a preset's shell tool."""
    if task.kind == "create":
        return [f"echo {shell_quote(task.line or '')} > {task.file}"]
    if task.kind in ("append", "rename"):
        return [pi_steps(task)[0][1]["command"]]
    if task.kind in ("fix", "upper"):
        return [f"cat {task.file}", f"sed -i 's/^{task.old}$/{task.new}/' {task.file}"]
    if task.kind == "sort":
        return [f"sort -o {task.file} {task.file}"]
    if task.kind == "reverse":
        return [f"tac {task.file} > {task.file}.tmp && mv {task.file}.tmp {task.file}"]
    if task.kind == "create-two":
        return [f"echo {shell_quote(task.line or '')} > {task.file}", f"echo {shell_quote(task.new or '')} > {task.new_file}"]
    return [f"mv {task.file} {task.new_file}", f"echo {shell_quote(task.line or '')} >> {task.new_file}"]  # rename-append


def final_text(task: FileTask) -> str:
    return {"create": f"Created {task.file}.", "append": f"Appended the line to {task.file}.",
            "rename": f"Renamed {task.file} to {task.new_file}.", "fix": f"Changed the line in {task.file}.",
            "sort": f"Sorted the lines of {task.file}.", "reverse": f"Reversed the lines of {task.file}.",
            "upper": f"Put the line in capitals in {task.file}.",
            "create-two": f"Created {task.file} and {task.new_file}.",
            "rename-append": f"Renamed {task.file} to {task.new_file} and appended the line."}[task.kind]


def demo_script(tasks: list[FileTask], preset: str = "pi") -> dict[str, Any]:
    """The scripted engine's script (tracefleet.engine.scripted.Script fields) that plays a correct agent on
    every task: one route per task, matched by its prompt; Pi's own tools for `pi`, the shell for any other
    preset."""
    from tracefleet.engine.scripted import Script, ScriptRoute, ScriptStep
    from tracefleet.runner.presets import get_preset

    routes = []
    for task in tasks:
        if preset == "pi":
            steps = [ScriptStep(tools=[tool], arguments=args) for tool, args in pi_steps(task)]
            routes.append(ScriptRoute(marker=task.prompt, steps=steps, final_text=final_text(task)))
        else:
            routes.append(ScriptRoute(marker=task.prompt, commands=shell_commands(task), final_text=final_text(task)))
    shell = get_preset(preset).shell_tool
    return Script(routes=routes, final_text="Done.", tool_preference=[shell] if shell else []).model_dump()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracefleet.trainer.filetasks", description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help=f"folder for {TRAIN_FILE} and {HELD_OUT_FILE}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train", type=int, default=200)
    p.add_argument("--held-out", type=int, default=60)
    p.add_argument("--kinds", nargs="+", choices=WIDE_KINDS, default=list(KINDS),
                   help=f"the task kinds, in turn (default: {' '.join(KINDS)})")
    a = p.parse_args(argv)
    train, held = write(a.out, a.seed, a.train, a.held_out, tuple(a.kinds))
    print(f"{a.train} train tasks: {train}\n{a.held_out} held-out tasks: {held}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
