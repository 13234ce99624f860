"""Gemini CLI (`gemini -p … --output-format stream-json`): Google generateContent /
streamGenerateContent at GOOGLE_GEMINI_BASE_URL with GEMINI_API_KEY. Usage statistics, telemetry and
auto-update are off in ~/.gemini/settings.json; yolo approval and --skip-trust keep it headless."""

from __future__ import annotations

import json

from tracefleet.runner.presets.base import CliPreset, HarnessLaunch, LaunchContext


def settings(ctx: LaunchContext) -> dict:
    return {
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "ide": {"enabled": False},
        "model": {"name": ctx.model},
    }


def build(ctx: LaunchContext) -> HarnessLaunch:
    return HarnessLaunch(
        argv=[
            ctx.binary, "--approval-mode", "yolo", "--skip-trust", "--output-format", "stream-json",
            "--model", ctx.model, *([] if ctx.prompt_on_stdin else ["-p", ctx.prompt]),  # piped stdin: headless
        ],
        env={
            "GOOGLE_GEMINI_BASE_URL": ctx.base_url,
            "GEMINI_API_KEY": ctx.api_key,
            "GEMINI_MODEL": ctx.model,
            "GEMINI_TELEMETRY_ENABLED": "false",
        },
        files={".gemini/settings.json": json.dumps(settings(ctx), indent=2)},
    )


PRESET = CliPreset(name="gemini-cli", dialect="google", shell_tool="run_shell_command", build=build)
