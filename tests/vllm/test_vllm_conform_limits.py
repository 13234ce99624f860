"""Against real vLLM (the session's `vllm_server`): output budgets and context limits through the proxy.

A harness call without max_tokens gets a whole answer in every dialect (exact mode never sends a null,
which vLLM answers with a 400 or cuts at 16 tokens); a max_tokens larger than the context is clamped (vLLM
would refuse it); a prompt that does not fit gets the dialect's own context-length error, in both modes.
Every recorded call satisfies len(completion_ids) == usage.completion_tokens == len(logprobs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fixtures.proxy_on_vllm import dialect_request, post, proxies  # noqa: F401 (a fixture)

# greedy SmolLM2 answers this in 30 tokens and stops (measured on vLLM 0.32): more than vLLM's default of 16
PROMPT = "Say hello."


def assert_counts_agree(rec: Any) -> None:
    assert len(rec.completion_ids) == rec.completion_tokens == len(rec.logprobs), rec
    assert rec.flags == []


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic", "google"])
def test_exact_mode_call_without_max_tokens_gets_a_whole_answer(vllm_server: Any, proxies: Any, dialect: str) -> None:
    proxy = proxies["exact"]
    path, body = dialect_request(dialect, vllm_server.model, PROMPT, None)
    r = post(proxy, dialect, path, body)
    assert r.status_code == 200, r.text
    rec = proxy.records()[-1]
    assert rec.status == "ok" and rec.finish_reason == "stop", rec
    assert rec.completion_tokens > 16  # not vLLM's default budget
    assert_counts_agree(rec)


@pytest.mark.parametrize("mode", ["exact", "server"])
def test_max_tokens_beyond_the_context_is_clamped(vllm_server: Any, proxies: Any, mode: str) -> None:
    proxy = proxies[mode]
    path, body = dialect_request("chat", vllm_server.model, PROMPT, vllm_server.max_model_len * 2)
    r = post(proxy, "chat", path, body)
    assert r.status_code == 200, r.text  # vLLM itself answers max_tokens > max_model_len with a 400
    rec = proxy.records()[-1]
    assert rec.status == "ok" and rec.finish_reason == "stop", rec
    assert_counts_agree(rec)


ERROR_SHAPES = {
    "chat": lambda j: j["error"]["code"] == "context_length_exceeded",
    "responses": lambda j: j["error"]["code"] == "context_length_exceeded",
    "anthropic": lambda j: j["type"] == "error" and j["error"]["type"] == "invalid_request_error"
    and "context length" in j["error"]["message"],
    "google": lambda j: j["error"]["status"] == "INVALID_ARGUMENT" and "context length" in j["error"]["message"],
}


@pytest.mark.parametrize("mode", ["exact", "server"])
def test_prompt_that_does_not_fit_gets_each_dialects_context_error(vllm_server: Any, proxies: Any, mode: str) -> None:
    proxy = proxies[mode]
    too_long = "word " * (vllm_server.max_model_len + 100)
    for dialect, shape in ERROR_SHAPES.items():
        path, body = dialect_request(dialect, vllm_server.model, too_long, 100)
        r = post(proxy, dialect, path, body)
        assert r.status_code == 400 and shape(r.json()), (mode, dialect, r.text)
        assert proxy.records()[-1].error.kind == "context_length"
