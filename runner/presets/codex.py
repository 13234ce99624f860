"""Codex CLI (`codex exec --json`): speaks only the OpenAI Responses API. The provider lives in
~/.codex/config.toml; analytics, feedback, plugins, OTEL export and update checks are switched off so it
reaches for nothing but the proxy. Codex's own sandbox needs kernel features a pod may not grant, so it is
bypassed: the runner's sandbox (process group, HOME, network namespace) is the boundary."""

from __future__ import annotations

import json

from tracefleet.runner.presets.base import CliPreset, HarnessLaunch, LaunchContext, v1
from tracefleet.contract import environment

API_KEY_ENV = environment.HARNESS_API_KEY


def toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string literal is a valid TOML basic string


def config_toml(ctx: LaunchContext) -> str:
    return f"""# written by tracefleet (codex preset)
model = {toml_string(ctx.model)}
model_provider = "tracefleet"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.tracefleet]
name = "tracefleet"
base_url = {toml_string(v1(ctx.base_url))}
env_key = "{API_KEY_ENV}"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[feedback]
enabled = false

[features]
plugins = false

[otel]
exporter = "none"
log_user_prompt = false

[history]
persistence = "none"
"""


def build(ctx: LaunchContext) -> HarnessLaunch:
    return HarnessLaunch(
        argv=[
            ctx.binary, "exec", "--json", "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox", "--ephemeral",
            "-C", str(ctx.workdir), "-m", ctx.model, "--", "-" if ctx.prompt_on_stdin else ctx.prompt,  # `-`: stdin
        ],
        env={API_KEY_ENV: ctx.api_key, "CODEX_HOME": str(ctx.home / ".codex")},
        files={".codex/config.toml": config_toml(ctx)},
    )


PRESET = CliPreset(name="codex", dialect="openai-responses", shell_tool="exec_command", build=build)
