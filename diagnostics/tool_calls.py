"""What an agent's tool call is (name and arguments, whatever the harness's dialect) and whether it may
have changed the workspace.

A capture record keeps each tool call as the proxy parsed it: `{"id", "name", "arguments", "kind"}` with
`arguments` the JSON text the model wrote (`kind: custom`: the raw input, e.g. Codex's freeform
`apply_patch`). Evidence written by other programs may carry the OpenAI (`function.arguments`), Anthropic
(`input`) or Google (`args`) shapes; `tool_call_parts` reads them all.

`may_change_workspace` is conservative: a call counts as possibly changing the workspace unless it is
certainly read-only, that is, one of
- a read-only tool of the harnesses (`READ_ONLY_TOOLS`: Claude Code Read/Glob/Grep/LS, Gemini and Qwen
  read_file/list_directory/glob/search_file_content, OpenCode and Pi read/list/glob/grep/find, Codex
  update_plan, web fetch/search, todo lists), or
- a shell tool (a shell-like name, `SHELL_SUBSTRINGS` in tracefleet.formats.shell_tools) whose command (under
  one of `COMMAND_KEYS`, a string or an argv list such as Codex's `["bash", "-lc", "..."]`) is made only
  of read-only programs (`READ_ONLY_PROGRAMS`: cat, ls, grep, rg, head, tail, wc, sed without `-i`, find
  without `-delete`/`-exec`, git status/diff/log/show, ...), joined by pipes, `;`, `&&`, `||`, with no
  output redirection other than to /dev/null or another descriptor, no `tee`, no command substitution.
Running the tests (`pytest`, `python -m pytest`, `python -m unittest`) counts as read-only: it writes
caches (`.pytest_cache`, `__pycache__`) but nothing a reviewer of the diff cares about; options that
write reports or update snapshots (`--junitxml`, `--snapshot-update`, `--cov-report`, ...) do not.
Anything the parser does not understand (unbalanced quotes, a program it does not know, an argument it
cannot read) counts as possibly changing: an unsure call never produces a finding.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from typing import Any

from tracefleet.formats.shell_tools import COMMAND_KEYS, SHELL_SUBSTRINGS


def tool_call_parts(call: dict[str, Any]) -> tuple[str | None, Any]:
    """(name, arguments) of a tool call in any of the shapes evidence carries; JSON-text arguments
    parsed when they parse (a custom tool's raw input stays text)."""
    fn = call.get("function") if isinstance(call.get("function"), dict) else {}
    name = call.get("name") or fn.get("name")
    args = next((v for v in (call.get("arguments"), fn.get("arguments"), call.get("input"), call.get("args")) if v is not None), None)
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    return (name if isinstance(name, str) else None), args


def _normal(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


# Tools that only read (names compared lower-cased without `_`/`-`): Claude Code, Gemini CLI / Qwen Code,
# OpenCode, Pi, Codex. Edit/Write/MultiEdit/NotebookEdit, write_file/replace, edit/write/patch, apply_patch,
# Task (a sub-agent), save_memory, ... are not here: they may change files.
READ_ONLY_TOOLS = frozenset(_normal(n) for n in (
    "Read", "Glob", "Grep", "LS", "NotebookRead", "WebFetch", "WebSearch", "TodoWrite", "TodoRead", "BashOutput",
    "ExitPlanMode", "read_file", "read_many_files", "list_directory", "glob", "search_file_content", "google_web_search",
    "web_fetch", "todo_write", "read", "list", "grep", "find", "ls", "webfetch", "websearch", "todowrite", "todoread",
    "view", "view_image", "list_dir", "grep_files", "update_plan", "think",
))

# Programs that do not write files (with the option checks below for sed, find, sort, git and the test runners).
READ_ONLY_PROGRAMS = frozenset((
    "cat", "ls", "ll", "grep", "egrep", "fgrep", "rg", "ag", "ack", "find", "head", "tail", "wc", "nl", "cut", "tr",
    "sort", "diff", "cmp", "comm", "file", "stat", "du", "df", "tree", "pwd", "cd", "echo", "printf", "true", "false",
    ":", "test", "[", "which", "type", "whoami", "id", "date", "uname", "hostname", "printenv", "basename", "dirname",
    "realpath", "readlink", "sleep", "nproc", "jq", "xxd", "od", "hexdump", "md5sum", "sha1sum", "sha256sum", "sed", "git",
    "pytest", "py.test", "python", "python3",
))
FIND_WRITES = frozenset(("-delete", "-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fprint0", "-fprintf", "-fls"))
GIT_READS = frozenset(("status", "diff", "log", "show", "blame", "ls-files", "grep", "rev-parse", "describe", "shortlog"))
TEST_MODULES = frozenset(("pytest", "unittest"))
TEST_OPTION_WRITES = re.compile(r"junit|report|update|log-file|basetemp|^--cov|result-?log", re.I)
SED_WRITES = re.compile(r"(^|[/;{}\s\d$])[wWe](\s|$)")  # sed's w/W (write a file) and e (run a command)
SEPARATORS = re.compile(r"^[;&|()\n]+$")
SAFE_TARGETS = frozenset(("/dev/null", "/dev/stdout", "/dev/stderr", "-"))
SHELLS = frozenset(("bash", "sh", "zsh", "dash"))
MAX_DEPTH = 3  # bash -c 'bash -c ...' nesting read before giving up (as changing)


def _words(command: str) -> list[str] | None:
    """The command's words and operators (`;`, `|`, `&&`, `>`, newlines as separators); None when it
    does not parse. A quoted lone operator (`grep '>' f`) comes out as an operator too: that can only make
    a call look changing."""
    lex = shlex.shlex(command, posix=True, punctuation_chars=";&|()<>\n")
    lex.whitespace = " \t\r"
    lex.commenters = ""  # a `#` is then a word: `ls # x` still reads as ls, and no comment can hide a command
    lex.whitespace_split = True
    try:
        return list(lex)
    except ValueError:
        return None


def _simple_commands(words: list[str]) -> list[list[str]] | None:
    """The words of each simple command, redirections checked and removed; None when one writes a file."""
    commands: list[list[str]] = [[]]
    i = 0
    while i < len(words):
        w = words[i]
        if set(w) <= set(";&|()<>\n") and ">" in w:
            target = words[i + 1] if i + 1 < len(words) else ""
            if w.endswith("&") and (target.isdigit() or target == "-"):
                i += 2  # 2>&1, >&2: to another descriptor
                continue
            if w in (">", ">>", "&>", "&>>", ">|") and target in SAFE_TARGETS:
                i += 2
                continue
            return None  # output into a file (or an operator too odd to read)
        if set(w) <= set(";&|()<\n") and "<" in w:
            i += 2  # input redirection, here-string: reads
            continue
        if SEPARATORS.match(w):
            commands.append([])
        else:
            commands[-1].append(w)
        i += 1
    return [c for c in commands if c]


def _program_reads(argv: list[str], depth: int) -> bool:
    while argv and re.match(r"^[A-Za-z_]\w*=", argv[0]):
        argv = argv[1:]  # VAR=value prefixes
    if not argv:
        return True
    prog, args = os.path.basename(argv[0]), argv[1:]
    if prog in SHELLS:
        script = next((args[k + 1] for k, a in enumerate(args[:-1]) if re.fullmatch(r"-[a-z]*c[a-z]*", a)), None)
        return script is not None and command_reads(script, depth + 1)
    if re.fullmatch(r"python3(\.\d+)?", prog):
        prog = "python"
    if prog not in READ_ONLY_PROGRAMS:
        return False
    if prog == "sed":
        return not any(a.startswith("--in-place") or (a.startswith("-") and not a.startswith("--") and "i" in a) or SED_WRITES.search(a)
                       for a in args)
    if prog == "find":
        return not FIND_WRITES.intersection(args)
    if prog == "sort":
        return not any(a.startswith(("-o", "--output")) for a in args)
    if prog == "git":
        while args and args[0] in ("-C", "-c", "--no-pager"):
            args = args[2:] if args[0] in ("-C", "-c") else args[1:]
        return bool(args) and args[0] in GIT_READS and not any(a.startswith("--output") for a in args)
    if prog == "python":
        if len(args) < 2 or args[0] != "-m" or args[1] not in TEST_MODULES:
            return False
        args = args[2:]
    if prog in ("python", "pytest", "py.test"):
        return not any(a.startswith("-") and TEST_OPTION_WRITES.search(a) for a in args)
    return True


def command_reads(command: str, depth: int = 0) -> bool:
    """Whether a shell command certainly only reads the workspace (see the module's doc)."""
    if depth > MAX_DEPTH or "`" in command or "$(" in command or "<(" in command or ">(" in command:
        return False
    words = _words(command)
    commands = _simple_commands(words) if words is not None else None
    return commands is not None and all(_program_reads(argv, depth) for argv in commands)


def _command(args: Any) -> str | None:
    """The shell command a shell tool's arguments carry: a string, or an argv list (Codex `shell`)."""
    if not isinstance(args, dict):
        return None
    value = next((v for k, v in args.items() if k.lower() in COMMAND_KEYS), None)
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return shlex.join(value)
    return None


def may_change_workspace(call: dict[str, Any]) -> bool:
    """False only for a call that certainly only reads (see the module's doc)."""
    name, args = tool_call_parts(call)
    if not name:
        return True
    norm = _normal(name)
    if norm in READ_ONLY_TOOLS:
        return False
    if any(sub in name.lower() for sub in SHELL_SUBSTRINGS):
        command = _command(args)
        return command is None or not command_reads(command)
    return True
