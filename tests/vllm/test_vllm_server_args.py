"""`tracefleet.vllm.vllm_server`: the one place vLLM's command line is built (operator, CLI, test fixture)."""

from __future__ import annotations

import pytest

from tracefleet.contract.job import Capture, Inference, ManagedInference
from tracefleet.vllm import (DEFAULT_VLLM_IMAGE, DEV_MODE_ENV, MIN_VLLM_VERSION, VLLM_VERSION, supported_version,
                             version_tuple, vllm_server)


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def server(model: str, *, extra: list[str] | None = None, **capture: str):
    inf = Inference(managed=ManagedInference(model=model, served_model_name="policy", tensor_parallel_size=2,
                                             extra_args=extra), capture=Capture(**capture))
    return vllm_server(inf, host="0.0.0.0", port=8000)


def test_server_args_carry_model_endpoint_tool_parser_and_dev_mode() -> None:
    s = server("HuggingFaceTB/SmolLM2-135M-Instruct", extra=["--max-model-len", "4096"])
    assert s.args[:10] == ["--model", "HuggingFaceTB/SmolLM2-135M-Instruct", "--served-model-name", "policy",
                           "--tensor-parallel-size", "2", "--host", "0.0.0.0", "--port", "8000"]
    assert "--enable-auto-tool-choice" in s.args and flag(s.args, "--tool-call-parser") == "hermes"
    assert "--enable-prompt-tokens-details" in s.args and "--reasoning-parser" not in s.args
    assert flag(s.args, "--logprobs-mode") == "processed_logprobs"  # the behaviour policy's logprobs
    assert s.args[-2:] == ["--max-model-len", "4096"]  # extraArgs last: vLLM keeps the last value of a flag
    assert s.env == {DEV_MODE_ENV: "1"}


@pytest.mark.parametrize(("model", "capture", "tool_parser", "reasoning"), [
    ("Qwen/Qwen3-4B", {}, "hermes", "qwen3"),
    ("Qwen/Qwen3-4B-Instruct-2507", {}, "hermes", None),
    ("Qwen/Qwen3-Coder-30B-A3B-Instruct", {}, "qwen3_coder", None),
    ("Qwen/Qwen3.5-4B", {}, "qwen3_coder", "qwen3"),
    ("meta-llama/Llama-3.1-8B-Instruct", {}, "llama3_json", None),
    ("google/gemma-3-270m-it", {}, "hermes", None),
    ("/models/my-finetune", {"modelFamily": "qwen3"}, "hermes", "qwen3"),
    ("/models/my-finetune", {"toolParser": "qwen3_coder"}, "qwen3_coder", None),
    ("/models/my-finetune", {"toolParser": "llama3"}, "llama3_json", None),
    ("/models/my-finetune", {"toolParser": "mistral"}, "mistral", None),  # a vLLM parser name, passed on
])
def test_parsers_follow_the_model_family(model: str, capture: dict, tool_parser: str, reasoning: str | None) -> None:
    args = server(model, **capture).args
    assert flag(args, "--tool-call-parser") == tool_parser
    assert flag(args, "--reasoning-parser") == reasoning


def test_external_inference_has_no_server() -> None:
    with pytest.raises(ValueError, match="managed"):
        vllm_server(Inference(external={"baseUrl": "http://vllm:8000"}), host="0.0.0.0", port=8000)


def test_versions() -> None:
    assert DEFAULT_VLLM_IMAGE.endswith(f":v{VLLM_VERSION}") and supported_version(VLLM_VERSION)
    assert version_tuple("v0.13.0rc1") == (0, 13, 0) and version_tuple("0.11.0+cpu") == (0, 11, 0)
    assert supported_version(MIN_VLLM_VERSION) and not supported_version("0.12.0") and not supported_version("dev")
