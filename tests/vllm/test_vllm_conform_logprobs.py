"""Against real vLLM (the session's `vllm_server`): what the recorded ids and logprobs are.

- vLLM's default logprobs (`--logprobs-mode raw_logprobs`) are taken before temperature: a call sampled at
  T=0.5 records exactly the logprobs of an unscaled re-score. So every record carries the sampling
  parameters and where they came from, which a trainer needs to know what distribution sampled.
- Server mode, streamed, with tools (the hermes parser holds text back): the ids and logprobs are all there,
  len(ids) == usage.completion_tokens == len(logprobs), and no record is flagged.
- `tool_choice: "none"` with tools: exact mode renders the prompt vLLM renders (tools included, as vLLM
  does unless started with --exclude-tools-when-tool-choice-none).
"""

from __future__ import annotations

from typing import Any

import httpx

from fixtures.proxy_on_vllm import auth_headers, dialect_request, post, proxies  # noqa: F401 (a fixture)

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def rescore(vllm: Any, prompt_ids: list[int], ids: list[int]) -> list[float]:
    """vLLM's own logprob of each of `ids` after `prompt_ids` (prompt_logprobs of the whole sequence)."""
    r = httpx.post(vllm.url + "/v1/completions", json={"model": vllm.model, "prompt": prompt_ids + ids, "max_tokens": 1,
                                                      "prompt_logprobs": 0}, timeout=60).raise_for_status().json()
    scored = r["choices"][0]["prompt_logprobs"][len(prompt_ids):]
    return [scored[i][str(t)]["logprob"] for i, t in enumerate(ids)]


def test_recorded_logprobs_are_vllms_raw_ones_and_the_record_says_how_it_sampled(vllm_server: Any, proxies: Any) -> None:
    proxy = proxies["exact"]
    path, body = dialect_request("chat", vllm_server.model, "Say hello.", 10, temperature=0.5, seed=3)
    assert post(proxy, "chat", path, body).status_code == 200
    rec = proxy.records()[-1]
    assert rec.sampling == {"temperature": {"value": 0.5, "source": "request"},
                            "top_p": {"value": None, "source": "engine_default"},
                            "top_k": {"value": None, "source": "engine_default"}}
    again = rescore(vllm_server, rec.prompt_ids, rec.completion_ids)
    # raw_logprobs: the T=1 distribution's, not the T=0.5 one that sampled
    assert max(abs(a - b) for a, b in zip(rec.logprobs, again, strict=True)) < 1e-4, (rec.logprobs, again)


def test_server_mode_streamed_tool_call_records_every_token(vllm_server: Any, proxies: Any) -> None:
    proxy = proxies["server"]
    path, body = dialect_request("chat", vllm_server.model, "List the files in the current directory.", 20,
                                 stream=True, tools=TOOLS)
    with httpx.stream("POST", proxy.url + path, json=body, headers=auth_headers("chat"), timeout=60) as r:
        assert r.status_code == 200
        r.read()
    rec = proxy.records()[-1]
    assert rec.status == "ok" and rec.flags == [], rec
    assert len(rec.completion_ids) == rec.completion_tokens == len(rec.logprobs) > 0
    again = rescore(vllm_server, rec.prompt_ids, rec.completion_ids)
    assert max(abs(a - b) for a, b in zip(rec.logprobs, again, strict=True)) < 1e-4, (rec.logprobs, again)


def test_tool_choice_none_renders_the_same_prompt_in_both_modes(vllm_server: Any, proxies: Any) -> None:
    path, body = dialect_request("chat", vllm_server.model, "Say hello.", 1, tools=TOOLS, tool_choice="none")
    prompts = {}
    for mode in ("server", "exact"):
        assert post(proxies[mode], "chat", path, body).status_code == 200
        prompts[mode] = proxies[mode].records()[-1].prompt_ids
    assert prompts["exact"] == prompts["server"]
