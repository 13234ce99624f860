"""The generic `command` preset: run any program that calls a model API. `{prompt}`, `{prompt_file}`, `{workdir}`,
`{home}`, `{base_url}`, `{base_url_v1}`, `{api_key}` and `{model}` are substituted in each argument
(other braces are left alone), and the endpoint is also given the ways most SDKs read it: OpenAI
(OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL), Anthropic (ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY) and
TRACEFLEET_BASE_URL / TRACEFLEET_API_KEY / TRACEFLEET_MODEL / TRACEFLEET_PROMPT / TRACEFLEET_PROMPT_FILE.

The prompt is always a file (TRACEFLEET_PROMPT_FILE, `{prompt_file}`); TRACEFLEET_PROMPT holds it too when it fits
one environment entry (base.MAX_ARG_STRLEN: a prompt of up to 1 MiB does not), and `{prompt}` only when it fits one
argument: a program that must take prompts of any valid length reads the file."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tracefleet.runner.presets.base import (
    COMMON_ENV,
    PROMPT_FILE,
    HarnessDialect,
    MAX_ARG_STRLEN,
    HarnessLaunch,
    fits_argument,
    v1,
)
from tracefleet.contract import environment

PLACEHOLDER = re.compile(r"\{(prompt|prompt_file|workdir|home|base_url|base_url_v1|api_key|model)\}")


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
        if not fits_argument(prompt) and any("{prompt}" in arg for arg in template):
            raise ValueError(f"the prompt ({len(prompt.encode())} bytes) is too long for one argument "
                             f"({MAX_ARG_STRLEN - 1} bytes at most): use {{prompt_file}} or TRACEFLEET_PROMPT_FILE")
        prompt_file = str(Path(home) / PROMPT_FILE)
        values = {
            "prompt": prompt,
            "prompt_file": prompt_file,
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
            **({environment.HARNESS_PROMPT: prompt} if fits_argument(prompt, name=environment.HARNESS_PROMPT) else {}),
            environment.HARNESS_PROMPT_FILE: prompt_file,
            environment.HARNESS_WORKDIR: str(workdir),
            "OPENAI_BASE_URL": v1(base_url),
            "OPENAI_API_KEY": api_key,
            "OPENAI_MODEL": model,
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": api_key,
        }
        return HarnessLaunch(argv=[render_argument(arg, values) for arg in template], env=env,
                             files={PROMPT_FILE: prompt})


PRESET = CommandPreset()
