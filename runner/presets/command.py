"""The generic `command` preset: run any program that calls a model API. `{prompt}`, `{workdir}`,
`{home}`, `{base_url}`, `{base_url_v1}`, `{api_key}` and `{model}` are substituted in each argument
(other braces are left alone), and the endpoint is also given the ways most SDKs read it: OpenAI
(OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL), Anthropic (ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY) and
TRACEFLEET_BASE_URL / TRACEFLEET_API_KEY / TRACEFLEET_MODEL / TRACEFLEET_PROMPT."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tracefleet.runner.presets.base import COMMON_ENV, HarnessDialect, HarnessLaunch, v1
from tracefleet.contract import environment

PLACEHOLDER = re.compile(r"\{(prompt|workdir|home|base_url|base_url_v1|api_key|model)\}")


def render_argument(template: str, values: dict[str, str]) -> str:
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


@dataclass(frozen=True)
class CommandPreset:
    name: str = "command"
    dialect: HarnessDialect = "any"
    command: tuple[str, ...] = ()  # default program; `launch(command=...)` overrides it per session

    def launch(
        self,
        *,
        prompt: str,
        workdir: Path,
        home: Path,
        base_url: str,
        api_key: str,
        model: str,
        command: Sequence[str] | None = None,
    ) -> HarnessLaunch:
        template = list(command) if command else list(self.command)
        if not template:
            raise ValueError("the command preset needs a command (spec.harness.command)")
        base_url = base_url.rstrip("/")
        values = {
            "prompt": prompt,
            "workdir": str(workdir),
            "home": str(home),
            "base_url": base_url,
            "base_url_v1": v1(base_url),
            "api_key": api_key,
            "model": model,
        }
        env = {
            **COMMON_ENV,
            "HOME": str(home),
            environment.HARNESS_BASE_URL: base_url,
            environment.HARNESS_API_KEY: api_key,
            environment.HARNESS_MODEL: model,
            environment.HARNESS_PROMPT: prompt,
            environment.HARNESS_WORKDIR: str(workdir),
            "OPENAI_BASE_URL": v1(base_url),
            "OPENAI_API_KEY": api_key,
            "OPENAI_MODEL": model,
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": api_key,
        }
        return HarnessLaunch(argv=[render_argument(arg, values) for arg in template], env=env, files={})


PRESET = CommandPreset()
