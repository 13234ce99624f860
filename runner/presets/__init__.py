"""Harness presets: how to point each real agent CLI at the proxy and run it headless.

    get_preset("claude-code").launch(prompt=..., workdir=..., home=..., base_url=..., api_key=..., model=...)
    -> HarnessLaunch(argv, env, files)

A preset is data plus a small function (see base.py). To add one: a module with a `build(ctx)` returning
a HarnessLaunch and a `PRESET = CliPreset(...)`, its pin in pins.json (installed by
hack/setup.d/50-harnesses.sh), and a line in PRESETS below.
"""

from __future__ import annotations

from pathlib import Path

from tracefleet.contract.session import HarnessConfig

from tracefleet.runner.presets import claude_code, codex, command, gemini_cli, opencode, pi, qwen_code
from tracefleet.runner.presets.base import (
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
from tracefleet.runner.presets.command import CommandPreset

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


def get_preset(name: str) -> Preset:
    """The preset called `name`. Unknown names raise KeyError listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown harness preset {name!r}; known: {', '.join(PRESETS)}") from None


def harness_launch(harness: HarnessConfig, *, prompt: str, workdir: Path, home: Path, base_url: str, api_key: str,
                   model: str) -> HarnessLaunch:
    """How a session's harness starts (argv, env, files): its preset's launch, for the `command` preset with the
    job's command."""
    preset = get_preset(harness.preset)
    if isinstance(preset, CommandPreset):
        return preset.launch(prompt=prompt, workdir=workdir, home=home, base_url=base_url, api_key=api_key, model=model,
                             command=harness.command)
    return preset.launch(prompt=prompt, workdir=workdir, home=home, base_url=base_url, api_key=api_key, model=model)


def cli_pin(preset: str) -> Pin | None:
    """The pinned CLI a harness of `preset` runs (None: the `command` preset runs the job's own program)."""
    return None if isinstance(get_preset(preset), CommandPreset) else harness_pins()[preset]


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
    "cli_pin",
    "get_preset",
    "harness_launch",
    "harness_pins",
    "installed_binary",
    "resolve_binary",
]
