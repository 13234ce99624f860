"""OpenCode (`opencode run --model tracefleet/M --format json`): the provider is declared in
~/.config/opencode/opencode.json through `@ai-sdk/openai-compatible` (bundled in the opencode binary,
so nothing is fetched), Chat Completions. Autoupdate, sharing, the models.dev catalogue fetch, LSP
downloads and default plugins (fetched from npm otherwise) are off; every permission is "allow"
because nobody is there to answer a prompt."""

from __future__ import annotations

import json

from tracefleet.runner.presets.base import CliPreset, HarnessLaunch, LaunchContext, v1
from tracefleet.contract import environment

PROVIDER = "tracefleet"


def config(ctx: LaunchContext) -> dict:
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "model": f"{PROVIDER}/{ctx.model}",
        "small_model": f"{PROVIDER}/{ctx.model}",
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny", "external_directory": "allow"},
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "tracefleet",
                "options": {"baseURL": v1(ctx.base_url), "apiKey": f"{{env:{environment.HARNESS_API_KEY}}}"},
                "models": {ctx.model: {"name": ctx.model, "tool_call": True}},
            }
        },
    }


def build(ctx: LaunchContext) -> HarnessLaunch:
    return HarnessLaunch(
        # `run` takes the message as positional words; "--" keeps a prompt starting with "-" a message.
        argv=[ctx.binary, "run", "--model", f"{PROVIDER}/{ctx.model}", "--format", "json",
              *([] if ctx.prompt_on_stdin else ["--", ctx.prompt])],  # no message: stdin is
        env={
            environment.HARNESS_API_KEY: ctx.api_key,
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
            "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
            "OPENCODE_CONFIG": str(ctx.home / ".config" / "opencode" / "opencode.json"),
        },
        files={".config/opencode/opencode.json": json.dumps(config(ctx), indent=2)},
    )


PRESET = CliPreset(name="opencode", dialect="openai-chat", shell_tool="bash", build=build)
