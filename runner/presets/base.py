"""What a harness preset is: data (which CLI, which pinned version, which wire dialect) plus one small
function that turns a session's endpoint into argv, environment and config files.

The runner gives every session a fresh HOME, writes `HarnessLaunch.files` into it, then runs `argv` in the
workspace with `env` added to its minimal environment. A preset never touches the filesystem itself, so
it can be tested (and read) as a pure function.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal, Protocol
from tracefleet.contract import environment

# The API a harness speaks (its dialect, as the capture log names it), or "any" for a command that speaks what it is told
HarnessDialect = Literal["openai-chat", "openai-responses", "anthropic", "google", "any"]

PINS_FILE = Path(__file__).with_name("pins.json")

# Every harness: no telemetry, no update checks, no interactive prompts, the proxy never bypassed by an
# inherited HTTP proxy (loopback is always direct).
COMMON_ENV: dict[str, str] = {
    "CI": "1",
    "DO_NOT_TRACK": "1",
    "NO_UPDATE_NOTIFIER": "1",
    "NO_COLOR": "1",
    "NO_PROXY": "127.0.0.1,localhost,::1",
    "no_proxy": "127.0.0.1,localhost,::1",
}


# Linux refuses to start a process with any one argument or environment entry over MAX_ARG_STRLEN bytes (32 pages,
# the terminating NUL included), and a task's prompt may hold 262,144 characters (up to 1 MiB of UTF-8). A prompt
# that does not fit is written to PROMPT_FILE in the session's HOME instead: a CLI reads it as its standard input,
# a `command` program by TRACEFLEET_PROMPT_FILE.
MAX_ARG_STRLEN = 32 * 4096
PROMPT_FILE = ".tracefleet/prompt"  # relative to HOME


def fits_argument(text: str, *, name: str = "") -> bool:
    """Whether `text` can be one argument (or, with `name`, the environment entry NAME=text) of a process."""
    return len(name.encode()) + (1 if name else 0) + len(text.encode()) + 1 <= MAX_ARG_STRLEN


@dataclass(frozen=True)
class HarnessLaunch:
    """How to start one harness session. `files`: path relative to HOME -> content, written before start;
    `stdin_file`: one of them (relative to HOME) the harness reads as its standard input (None: no input)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    stdin_file: str | None = None


class Preset(Protocol):
    name: str
    dialect: HarnessDialect

    def launch(
        self, *, prompt: str, workdir: Path, home: Path, base_url: str, api_key: str, model: str
    ) -> HarnessLaunch: ...


@dataclass(frozen=True)
class LaunchContext:
    """The arguments of `Preset.launch`, plus the resolved binary, handed to a preset's build function."""

    binary: str
    prompt: str
    workdir: Path
    home: Path
    base_url: str  # proxy root (with any /s/<id> prefix), no trailing slash, no /v1
    api_key: str
    model: str

    @property
    def prompt_on_stdin(self) -> bool:
        """The prompt is too long for an argument: the CLI reads it from its standard input (PROMPT_FILE)."""
        return not fits_argument(self.prompt)


@dataclass(frozen=True)
class Pin:
    package: str
    version: str
    bin: str


@lru_cache(maxsize=1)
def harness_pins() -> dict[str, Pin]:
    """The pinned npm package, version and binary name of each real harness (runner/presets/pins.json)."""
    raw = json.loads(PINS_FILE.read_text())
    return {name: Pin(**pin) for name, pin in raw.items() if not name.startswith("_")}


def harness_cache_dir() -> Path:
    return environment.cache_dir() / "harnesses"


def installed_binary(name: str) -> Path | None:
    """The binary hack/setup.d/50-harnesses.sh installed for harness `name`, or None when it is not there.

    `TRACEFLEET_<NAME>_BIN` (e.g. TRACEFLEET_CLAUDE_CODE_BIN) overrides the cache location."""
    override = os.environ.get(environment.harness_bin(name))
    if override:
        return Path(override) if Path(override).exists() else None
    pin = harness_pins()[name]
    path = harness_cache_dir() / f"{name}-{pin.version}" / "node_modules" / ".bin" / pin.bin
    return path if path.exists() else None


def resolve_binary(name: str) -> str:
    """The pinned install when present, else whatever `bin` is on PATH, else the bare name (the start then
    fails with a clear 'not found' from the runner)."""
    found = installed_binary(name)
    if found is not None:
        return str(found)
    bin_name = harness_pins()[name].bin
    return shutil.which(bin_name) or bin_name


def v1(base_url: str) -> str:
    return base_url.rstrip("/") + "/v1"


@dataclass(frozen=True)
class CliPreset:
    """A real harness CLI: pinned package data + the function that builds its launch."""

    name: str
    dialect: HarnessDialect
    shell_tool: str  # the name of the harness's shell tool, as the model must call it
    build: Callable[[LaunchContext], HarnessLaunch]
    binary: str | None = None  # explicit path; default: the pinned install (see resolve_binary)

    def launch(
        self, *, prompt: str, workdir: Path, home: Path, base_url: str, api_key: str, model: str
    ) -> HarnessLaunch:
        ctx = LaunchContext(
            binary=self.binary or resolve_binary(self.name),
            prompt=prompt,
            workdir=Path(workdir),
            home=Path(home),
            base_url=base_url.rstrip("/"),
            api_key=api_key,
            model=model,
        )
        made = self.build(ctx)
        env = {**COMMON_ENV, "HOME": str(ctx.home), **made.env}
        if not ctx.prompt_on_stdin:
            return HarnessLaunch(argv=made.argv, env=env, files=made.files)
        return HarnessLaunch(argv=made.argv, env=env, files={**made.files, PROMPT_FILE: ctx.prompt},
                             stdin_file=PROMPT_FILE)
