"""Qwen Code (`qwen -p … --output-format stream-json`): OpenAI Chat Completions at OPENAI_BASE_URL.
Telemetry, usage statistics and auto-update are off in ~/.qwen/settings.json; yolo approval runs tools
without asking (headless)."""

from __future__ import annotations

import json

from tracefleet.runner.presets.base import CliPreset, HarnessLaunch, LaunchContext, v1


def settings(ctx: LaunchContext) -> dict:
    return {
        "general": {"enableAutoUpdate": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "security": {"auth": {"selectedType": "openai"}, "folderTrust": {"enabled": False}},
        "model": {"name": ctx.model},
    }


def build(ctx: LaunchContext) -> HarnessLaunch:
    return HarnessLaunch(
        argv=[
            ctx.binary, "--auth-type", "openai", "--approval-mode", "yolo", "--output-format", "stream-json",
            "--model", ctx.model,
            # piped stdin: headless, the prompt as `<stdin>\n\n<-p>` (two newlines added at its end)
            *([] if ctx.prompt_on_stdin else ["-p", ctx.prompt]),
        ],
        env={
            "OPENAI_BASE_URL": v1(ctx.base_url),
            "OPENAI_API_KEY": ctx.api_key,
            "OPENAI_MODEL": ctx.model,
            "QWEN_TELEMETRY_ENABLED": "0",
            "QWEN_CODE_DISABLE_PRECONNECT": "1",
        },
        files={".qwen/settings.json": json.dumps(settings(ctx), indent=2)},
    )


PRESET = CliPreset(name="qwen-code", dialect="openai-chat", shell_tool="run_shell_command", build=build)
