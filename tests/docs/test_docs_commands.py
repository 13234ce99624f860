"""Every command the docs show still exists as shown.

The convention (also in CONTRIBUTING.md), which needs nothing registered by whoever writes a page:
  ```bash     commands a reader types (```sh and ```shell alike): checked here, every line of every such
              block in README.md, CONTRIBUTING.md and docs/**/*.md;
  ```console  ```text  output (or a session with its output): not checked;
  ```python   ```yaml  code and manifests: not checked here (the snippets that matter have their own tests).
In a ```bash block:
  - `tracefleet …` is parsed by the real CLI's argparse parser (tracefleet.cli.build_parser), without running
    it: the subcommand, its actions and every flag must exist and take the values shown (placeholders such as
    JOB.yaml or URL are fine where any string is). The cheap ones run for real: `--help`, and `validate` of
    files the repository ships, which must pass.
  - `make TARGET` must be a Makefile target, `bash hack/setup.sh DOOR` a door it knows.
  - every argument naming a path in the repository (examples/…, charts/…, hack/…) must exist, whatever the
    program (`kubectl apply -f examples/…` included).
A line is cut at its first shell operator (|, &&, ;, &, >) and at `#`; `\\` continues a line.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tracefleet.cli import SUBCOMMANDS, build_parser

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "tracefleet"
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^(?P<indent> *)```(?:bash|sh|shell)\b[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "&>", "(", ")"}
# Top-level folders of the repository: an argument starting with one of them names a file that must exist.
REPO_FOLDERS = tuple(sorted({f"{path.split('/')[0]}/" for path in subprocess.run(
    ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.splitlines() if "/" in path}))
RUNNABLE = {"validate"}  # besides --help: quick, reads only files, writes nothing


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {shlex.join(self.argv)}"


def _commands(text: str, page: str) -> list[Command]:
    found = []
    for block in BLOCK.finditer(text):
        first = text.count("\n", 0, block.start("body")) + 1
        body = block.group("body")
        logical, start = "", first
        for n, raw in enumerate(body.splitlines(), first):
            if not logical:
                start = n
            logical += (raw.strip().removeprefix("$ ") if not logical else raw).removesuffix("\\").rstrip() + " "
            if raw.rstrip().endswith("\\"):
                continue
            lexer = shlex.shlex(logical, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words = list(lexer)
            logical = ""
            while words:
                cut = next((i for i, w in enumerate(words) if w in OPERATORS), len(words))
                argv, words = words[:cut], words[cut + 1:]
                while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
                    argv = argv[1:]  # VAR=value before the program
                if argv:
                    found.append(Command(page, start, tuple(argv)))
    return found


def commands() -> list[Command]:
    return [c for page in PAGES for c in _commands(page.read_text(), str(page.relative_to(REPO)))]


ALL = commands()
TRACEFLEET = [c for c in ALL if Path(c.argv[0]).name == "tracefleet"]


def test_the_docs_show_commands() -> None:
    # The collector works: the front door's two commands and the quickstart's inspection are found.
    shown = {shlex.join(c.argv) for c in ALL if c.page == "README.md"}
    assert {"make quickstart", "make test"} <= shown, shown
    assert len(TRACEFLEET) >= 10, [str(c) for c in TRACEFLEET]
    # ...and the parser check refuses what no longer exists.
    assert parse(("run", "JOB.yaml", "--no-such-flag"))[0] == 2
    assert parse(("traces", "list", "URI"))[0] == 2
    assert parse(("run", "JOB.yaml", "--engine-url", "URL"))[0] == 0


def parse(argv: tuple[str, ...]) -> tuple[int, str]:
    """(exit status, what argparse printed) for `tracefleet ARGV` through the real parser, not running it."""
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(chosen if chosen in {s.name for s in SUBCOMMANDS} else None)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            args = parser.parse_args(list(argv))
        except SystemExit as exc:
            return int(exc.code or 0), err.getvalue() or out.getvalue()
    assert isinstance(args, argparse.Namespace)
    return 0, ""


@pytest.mark.parametrize("cmd", TRACEFLEET, ids=str)
def test_tracefleet_commands_parse(cmd: Command) -> None:
    status, said = parse(cmd.argv[1:])
    assert status == 0, f"{cmd}\n  the CLI says: {said.strip()}"


def _shipped_files(args: tuple[str, ...]) -> list[str] | None:
    """The files a `validate` names when every one of them is in the repository (globs expanded), else None."""
    files = []
    for arg in args:
        if arg.startswith("-"):
            continue
        matched = sorted(glob.glob(arg, root_dir=REPO))
        if not matched:
            return None
        files += matched
    return files or None


RUN = [c for c in TRACEFLEET if "--help" in c.argv or "-h" in c.argv
       or (len(c.argv) > 1 and c.argv[1] in RUNNABLE and _shipped_files(c.argv[2:]))]


@pytest.mark.parametrize("cmd", RUN, ids=str)
def test_cheap_commands_run(cmd: Command) -> None:
    argv = list(cmd.argv[1:])
    if argv[0] == "validate" and "--help" not in argv:
        argv = ["validate", *(_shipped_files(cmd.argv[2:]) or [])]
    proc = subprocess.run([str(SCRIPT), *argv], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}{proc.stderr}"


def test_make_and_setup_commands_exist() -> None:
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", makefile, re.M))
    for cmd in ALL:
        if cmd.argv[0] == "make":
            for target in (a for a in cmd.argv[1:] if not a.startswith("-") and "=" not in a):
                assert target in targets, f"{cmd}: no Makefile target {target!r}"
        if cmd.argv[:2] == ("bash", "hack/setup.sh") and len(cmd.argv) > 2 and not cmd.argv[2].startswith("-"):
            proc = subprocess.run(["bash", "hack/setup.sh", "--parts", cmd.argv[2]], cwd=REPO, capture_output=True,
                                  text=True, timeout=60)
            assert proc.returncode == 0, f"{cmd}: {proc.stderr.strip()}"


def test_repository_paths_in_commands_exist() -> None:
    missing = []
    for cmd in ALL:
        for arg in cmd.argv[1:]:
            value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
            value = value.split("::", 1)[0]  # a pytest node id names its file
            if value.startswith(REPO_FOLDERS) and not glob.glob(value.rstrip("/"), root_dir=REPO):
                missing.append(f"{cmd}: {value}")
    assert not missing, "\n".join(missing)
