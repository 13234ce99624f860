"""Claude Code (`claude -p --output-format stream-json --verbose`): Anthropic Messages API at
ANTHROPIC_BASE_URL. Non-essential traffic, telemetry, error reporting and the auto-updater are off.
As root, `--dangerously-skip-permissions` is refused, so tools are granted with `--allowedTools`.
The per-conversation attribution hash in system block 0 is switched off so that prompts of one
session stay byte-identical prefixes of each other (exact traces)."""

from __future__ import annotations

import json

from tracefleet.runner.presets.base import CliPreset, HarnessLaunch, LaunchContext

ALLOWED_TOOLS = "Bash,Read,Edit,Write,Glob,Grep,NotebookEdit"


def build(ctx: LaunchContext) -> HarnessLaunch:
    return HarnessLaunch(
        argv=[
            ctx.binary, "-p", "--output-format", "stream-json", "--verbose",
            "--model", ctx.model, "--allowedTools", ALLOWED_TOOLS,
            *([] if ctx.prompt_on_stdin else ["--", ctx.prompt]),  # without one, `-p` reads stdin
        ],
        env={
            "ANTHROPIC_BASE_URL": ctx.base_url,
            "ANTHROPIC_API_KEY": ctx.api_key,
            "ANTHROPIC_MODEL": ctx.model,
            # The "small fast" model (titles, summaries) is the same served model.
            "ANTHROPIC_SMALL_FAST_MODEL": ctx.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": ctx.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_BUG_COMMAND": "1",
        },
        files={
            # Skips first-run onboarding; harmless in -p mode, needed if a job runs it interactively.
            ".claude.json": json.dumps({"hasCompletedOnboarding": True, "autoUpdates": False}),
        },
    )


PRESET = CliPreset(name="claude-code", dialect="anthropic", shell_tool="Bash", build=build)
