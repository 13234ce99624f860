"""How the harnesses name a shell tool and its command argument, for whoever reads or writes tool calls:
the scripted engine (which tool to call, which argument gets the command) and the diagnostics (whether a
call ran a shell command, and which).

Codex `shell`/`exec_command`, Claude Code `Bash`, Qwen Code / Gemini CLI `run_shell_command`, OpenCode and
Pi `bash`, ...: a tool whose lower-cased name contains one of SHELL_SUBSTRINGS is shell-like, and its
command is under one of COMMAND_KEYS (a string, or an argv list such as Codex's `["bash", "-lc", "..."]`).
"""

from __future__ import annotations

SHELL_SUBSTRINGS = ("shell", "bash", "exec", "command", "terminal", "run")
COMMAND_KEYS = frozenset(("command", "cmd", "commands", "script", "code"))
