"""Against real vLLM (the session's `vllm_server`): output budgets and context limits through the proxy.

A harness call without max_tokens gets a whole answer in every dialect (exact mode never sends a null,
which vLLM answers with a 400 or cuts at 16 tokens); a max_tokens larger than the context is clamped (vLLM
would refuse it); a prompt that does not fit gets the dialect's own context-length error, in both modes.
Every recorded call satisfies len(completion_ids) == usage.completion_tokens == len(logprobs).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tracefleet.capture import read_capture_log
from tracefleet.proxy.app import create_app
from tracefleet.proxy.config import PresetSession, ProxyConfig

from fixtures.servers import ServedApp, serve_in_thread

SECRET = "conform-secret-0123456789"
# greedy SmolLM2 answers this in 30 tokens and stops (measured on vLLM 0.32): more than vLLM's default of 16
PROMPT = "Say hello."


def dialect_request(dialect: str, model: str, text: str, max_tokens: int | None) -> tuple[str, dict[str, Any]]:
    """The path and body a harness of `dialect` sends for one user message, greedy."""
    if dialect == "chat":
        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": text}], "temperature": 0}
        return "/v1/chat/completions", body | ({"max_tokens": max_tokens} if max_tokens else {})
    if dialect == "responses":
        body = {"model": model, "input": text, "temperature": 0}
        return "/v1/responses", body | ({"max_output_tokens": max_tokens} if max_tokens else {})
    if dialect == "anthropic":  # Anthropic's API requires max_tokens: harnesses send a large one
        return "/v1/messages", {"model": model, "max_tokens": max_tokens or 64_000, "temperature": 0,
                                "messages": [{"role": "user", "content": text}]}
    config: dict[str, Any] = {"temperature": 0} | ({"maxOutputTokens": max_tokens} if max_tokens else {})
    return f"/v1beta/models/{model}:generateContent", {"contents": [{"role": "user", "parts": [{"text": text}]}],
                                                       "generationConfig": config}


def post(proxy: ServedApp, dialect: str, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"x-api-key": SECRET, "anthropic-version": "2023-06-01"} if dialect == "anthropic" else \
        {"x-goog-api-key": SECRET} if dialect == "google" else {"authorization": f"Bearer {SECRET}"}
    return httpx.post(proxy.url + path, json=body, headers=headers, timeout=60)


def served_model_dir(url: str) -> str:
    """The model directory vLLM serves (its model card's `root`): exact mode renders with its tokenizer and
    chat template, the same files vLLM renders with."""
    card = httpx.get(url + "/v1/models", timeout=10).raise_for_status().json()["data"][0]
    return str(card["root"])


@pytest.fixture(scope="module")
def proxies(vllm_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[ServedApp, Path]]]:
    out: dict[str, tuple[ServedApp, Path]] = {}
    for mode in ("exact", "server"):
        capture = tmp_path_factory.mktemp(f"capture-{mode}")
        config = ProxyConfig(engine_url=vllm_server.url, capture_dir=capture, admin_token="admin-" + SECRET, mode=mode,
                             model_path=served_model_dir(vllm_server.url) if mode == "exact" else None, served_model=vllm_server.model,
                             sessions=[PresetSession(session_id="s", secret=SECRET)])
        out[mode] = (serve_in_thread(create_app(config)), capture)
    yield out
    for served, _ in out.values():
        served.stop()


def last_record(capture: Path) -> Any:
    return read_capture_log(capture / "s.jsonl").records[-1]


def assert_counts_agree(rec: Any) -> None:
    assert len(rec.completion_ids) == rec.completion_tokens == len(rec.logprobs), rec
    assert rec.flags == []


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic", "google"])
def test_exact_mode_call_without_max_tokens_gets_a_whole_answer(vllm_server: Any, proxies: Any, dialect: str) -> None:
    proxy, capture = proxies["exact"]
    path, body = dialect_request(dialect, vllm_server.model, PROMPT, None)
    r = post(proxy, dialect, path, body)
    assert r.status_code == 200, r.text
    rec = last_record(capture)
    assert rec.status == "ok" and rec.finish_reason == "stop", rec
    assert rec.completion_tokens > 16  # not vLLM's default budget
    assert_counts_agree(rec)


@pytest.mark.parametrize("mode", ["exact", "server"])
def test_max_tokens_beyond_the_context_is_clamped(vllm_server: Any, proxies: Any, mode: str) -> None:
    proxy, capture = proxies[mode]
    path, body = dialect_request("chat", vllm_server.model, PROMPT, vllm_server.max_model_len * 2)
    r = post(proxy, "chat", path, body)
    assert r.status_code == 200, r.text  # vLLM itself answers max_tokens > max_model_len with a 400
    rec = last_record(capture)
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
    proxy, capture = proxies[mode]
    too_long = "word " * (vllm_server.max_model_len + 100)
    for dialect, shape in ERROR_SHAPES.items():
        path, body = dialect_request(dialect, vllm_server.model, too_long, 100)
        r = post(proxy, dialect, path, body)
        assert r.status_code == 400 and shape(r.json()), (mode, dialect, r.text)
        assert last_record(capture).error.kind == "context_length"
