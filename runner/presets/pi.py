"""Pi (`pi --provider tracefleet --model M --mode json -p`): the provider is declared in
~/.pi/agent/models.json (Chat Completions by default; Pi can also speak Responses or Anthropic Messages).
PI_OFFLINE=1 turns off every startup network operation (update checks, install telemetry)."""

from __future__ import annotations

import json

from tracefleet.runner.presets.base import CliPreset, HarnessLaunch, LaunchContext, v1
from tracefleet.contract import environment

PROVIDER = "tracefleet"
API_KEY_ENV = environment.HARNESS_API_KEY  # models.json resolves an upper-case name from the environment


def models_json(ctx: LaunchContext, api: str = "openai-completions") -> dict:
    return {
        "providers": {
            PROVIDER: {
                "baseUrl": v1(ctx.base_url),
                "api": api,
                "apiKey": API_KEY_ENV,
                "models": [{"id": ctx.model, "name": ctx.model, "reasoning": False, "input": ["text"]}],
            }
        }
    }


def build(ctx: LaunchContext) -> HarnessLaunch:
    return HarnessLaunch(
        argv=[
            ctx.binary, "--provider", PROVIDER, "--model", ctx.model, "--mode", "json", "--no-session",
            "--offline", "-p", *([] if ctx.prompt_on_stdin else [ctx.prompt]),  # piped stdin: the message, trimmed
        ],
        env={API_KEY_ENV: ctx.api_key, "PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"},
        files={
            ".pi/agent/models.json": json.dumps(models_json(ctx), indent=2),
            ".pi/agent/settings.json": json.dumps({"enableInstallTelemetry": False, "quietStartup": True}),
        },
    )


PRESET = CliPreset(name="pi", dialect="openai-chat", shell_tool="bash", build=build)
