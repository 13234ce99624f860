"""Harness presets: how to point each real agent CLI at the proxy and run it headless.

    get_preset("claude-code").launch(prompt=..., workdir=..., home=..., base_url=..., api_key=..., model=...)
    -> HarnessLaunch(argv, env, files)

A preset is data plus a small function (see base.py). To add one: a module with a `build(ctx)` returning
a HarnessLaunch and a `PRESET = CliPreset(...)`, its pin in pins.json (installed by
hack/setup.d/50-harnesses.sh), and a line in PRESETS below.
"""

from __future__ import annotations

from tracefleet.contract.session import preset_name

from . import claude_code, codex, command, gemini_cli, opencode, pi, qwen_code
from .base import (
    COMMON_ENV,
    CliPreset,
    HarnessLaunch,
    LaunchContext,
    Pin,
    Preset,
    harness_pins,
    installed_binary,
    resolve_binary,
)
from .command import CommandPreset

PRESETS: dict[str, Preset] = {
    "codex": codex.PRESET,
    "claude-code": claude_code.PRESET,
    "qwen-code": qwen_code.PRESET,
    "pi": pi.PRESET,
    "gemini-cli": gemini_cli.PRESET,
    "opencode": opencode.PRESET,
    "command": command.PRESET,
}

REAL_HARNESSES = ("codex", "claude-code", "qwen-code", "pi", "gemini-cli", "opencode")


def get_preset(name: str | None) -> Preset:
    """The preset called `name` (None means the generic `command` preset). Unknown names raise KeyError
    listing the known ones."""
    key = preset_name(name)
    try:
        return PRESETS[key]
    except KeyError:
        raise KeyError(f"unknown harness preset {name!r}; known: {', '.join(PRESETS)}") from None


__all__ = [
    "COMMON_ENV",
    "CliPreset",
    "CommandPreset",
    "HarnessLaunch",
    "LaunchContext",
    "PRESETS",
    "Pin",
    "Preset",
    "REAL_HARNESSES",
    "get_preset",
    "harness_pins",
    "installed_binary",
    "resolve_binary",
]
