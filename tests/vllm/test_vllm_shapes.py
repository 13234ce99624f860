"""What real vLLM answers, on the points the proxy relies on (completions, chat, token-in routes).

Against the `vllm_server` fixture (vLLM's CPU build started with the operator's arguments for SmolLM2):
completions return the prompt and sampled ids per choice (the prompt ids only in the first streamed
chunk), sampled logprobs equal a `prompt_logprobs` re-score of the same sequence, chat returns the
prompt ids at the top level and renders exactly what the proxy's exact mode renders from the same model
directory, streamed chunks keep their ids and logprobs while the hermes tool parser holds the text back,
and the prefix-cache counters the exact-mode tests read move on a repeated prompt.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tracefleet.engine.vllm_local import model_dir
from tracefleet.formats.families import load_model_format

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Count from one to five."}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# Structured outputs force SmolLM2 (which rarely calls tools by itself) to write a hermes tool call.
HERMES_CALL = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}\n</tool_call>'


@pytest.fixture(scope="module")
def fmt():
    return load_model_format(str(model_dir()), name="smollm2")


def post(vllm_server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(vllm_server.url + path, json={"model": vllm_server.model, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def stream(vllm_server, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    with httpx.stream("POST", vllm_server.url + path, timeout=120,
                      json={"model": vllm_server.model, "stream": True, "stream_options": {"include_usage": True},
                            **body}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def test_completions_carry_ids_per_choice_and_logprobs_equal_a_rescore(vllm_server, fmt) -> None:
    prompt = fmt.encode(fmt.render(MESSAGES))
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 0, "return_token_ids": True}
    out = post(vllm_server, "/v1/completions", body)
    (choice,) = out["choices"]
    ids, lps = choice["token_ids"], choice["logprobs"]["token_logprobs"]
    assert choice["prompt_token_ids"] == prompt  # token-in: used as given, no BOS added
    assert len(ids) == len(lps) == out["usage"]["completion_tokens"] > 0

    chunks = stream(vllm_server, "/v1/completions", body)
    firsts = [c["choices"][0] for c in chunks if c["choices"]]
    assert firsts[0]["prompt_token_ids"] == prompt
    assert all(c.get("prompt_token_ids") is None for c in firsts[1:])
    assert [t for c in firsts for t in (c.get("token_ids") or [])] == ids  # greedy: the same ids streamed
    assert chunks[-1]["usage"]["completion_tokens"] == len(ids)

    # The sampled logprobs are the model's own: a re-score of prompt + sampled ids gives the same numbers.
    rescore = post(vllm_server, "/v1/completions", {"prompt": prompt + ids, "max_tokens": 1, "temperature": 0,
                                                    "prompt_logprobs": 0})
    scored = rescore["choices"][0]["prompt_logprobs"][len(prompt):]
    assert [entry[str(t)]["logprob"] for entry, t in zip(scored, ids)] == pytest.approx(lps, abs=1e-4)


def test_chat_renders_what_exact_mode_renders_and_returns_prompt_ids_at_top_level(vllm_server, fmt) -> None:
    out = post(vllm_server, "/v1/chat/completions", {"messages": MESSAGES, "tools": [WEATHER_TOOL], "max_tokens": 4,
                                                      "logprobs": True, "return_token_ids": True})
    assert out["prompt_token_ids"] == fmt.encode(fmt.render(MESSAGES, tools=[WEATHER_TOOL]))
    (choice,) = out["choices"]
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) == out["usage"]["completion_tokens"]


def test_streamed_ids_and_logprobs_survive_the_tool_parser_buffering(vllm_server) -> None:
    chunks = stream(vllm_server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": [WEATHER_TOOL],
        "structured_outputs": {"regex": HERMES_CALL}, "max_tokens": 60, "temperature": 0, "logprobs": True,
        "return_token_ids": True})
    assert chunks[0]["prompt_token_ids"]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    held_back = [c for c in choices if c["delta"] == {}]
    assert held_back and all(c["token_ids"] and c["logprobs"]["content"] for c in held_back)
    ids = [t for c in choices for t in (c.get("token_ids") or [])]
    lps = [lp for c in choices for lp in ((c.get("logprobs") or {}).get("content") or [])]
    assert len(ids) == len(lps) == chunks[-1]["usage"]["completion_tokens"]
    calls = [tc for c in choices for tc in c["delta"].get("tool_calls") or []]
    assert calls and calls[0]["function"]["name"] == "get_weather", [c["delta"] for c in choices]
    assert json.loads("".join(tc["function"].get("arguments") or "" for tc in calls)) == {"city": "Paris"}
    assert choices[-1]["finish_reason"] == "tool_calls"


def test_prefix_cache_counters_move_on_a_repeated_prompt(vllm_server, fmt) -> None:
    long_text = " ".join(f"item-{i}" for i in range(150))
    prompt = fmt.encode(fmt.render([{"role": "user", "content": long_text}]))
    before = vllm_server.metrics()
    for _ in range(2):
        post(vllm_server, "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    after = vllm_server.metrics()
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    assert queries >= 2 * len(prompt) - 1 and hits >= len(prompt) // 2, (len(prompt), queries, hits)
    assert "vllm:num_requests_running" in after  # a gauge (other tests may be using the server meanwhile)
