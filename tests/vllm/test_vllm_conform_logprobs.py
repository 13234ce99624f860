"""Against real vLLM (the session's `vllm_server`): what the recorded ids and logprobs are.

- The server runs `--logprobs-mode processed_logprobs` (tracefleet.vllm): a call sampled at T=0.5 with
  top_k=20 records the logprobs of that distribution, the top 20 of the raw logprobs divided by T and
  renormalised (vLLM's default, raw_logprobs, would record the unscaled T=1 ones). Every record also carries
  the sampling parameters and where they came from.
- A job's sampling (spec.inference.sampling) replaces the harness's: the call is sampled and recorded at the
  job's temperature and top-k, with source `job`.
- Server mode, streamed, with tools (the hermes parser holds text back): the ids and logprobs are all there,
  len(ids) == usage.completion_tokens == len(logprobs), and no record is flagged.
- `tool_choice: "none"` with tools: exact mode renders the prompt vLLM renders (tools included, as vLLM
  does unless started with --exclude-tools-when-tool-choice-none).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx

from tracefleet.contract.sampling import SamplingOverride

from fixtures.proxy_on_vllm import auth_headers, dialect_request, post, proxies, start_proxy_on_vllm  # noqa: F401 (a fixture)

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def rescore(vllm: Any, prompt_ids: list[int], ids: list[int], top: int = 0) -> list[dict[int, float]]:
    """vLLM's own raw logprobs after `prompt_ids` (prompt_logprobs of the whole sequence): per token of `ids`,
    its own logprob and those of the `top` most likely tokens at that position."""
    r = httpx.post(vllm.url + "/v1/completions", json={"model": vllm.model, "prompt": prompt_ids + ids, "max_tokens": 1,
                                                      "prompt_logprobs": top}, timeout=60).raise_for_status().json()
    scored = r["choices"][0]["prompt_logprobs"][len(prompt_ids):]
    return [{int(k): v["logprob"] for k, v in scored[i].items()} for i in range(len(ids))]


def own(scores: list[dict[int, float]], ids: list[int]) -> list[float]:
    return [s[t] for s, t in zip(scores, ids, strict=True)]


def test_recorded_logprobs_are_the_distribution_that_sampled(vllm_server: Any, proxies: Any) -> None:
    proxy, temperature, top_k = proxies["exact"], 0.5, 20
    path, body = dialect_request("chat", vllm_server.model, "Say hello.", 10, temperature=temperature, top_k=top_k, seed=3)
    assert post(proxy, "chat", path, body).status_code == 200
    rec = proxy.records()[-1]
    assert rec.sampling == {"temperature": {"value": temperature, "source": "request"},
                            "top_p": {"value": None, "source": "engine_default"},
                            "top_k": {"value": top_k, "source": "request"},
                            "seed": {"value": 3, "source": "request"},
                            "max_tokens": {"value": 10, "source": "request"}}
    assert rec.logprobs_mode == "processed_logprobs"  # the vLLM tracefleet started, told the proxy from its args
    assert_sampled_at(vllm_server, rec, temperature, top_k)


def assert_sampled_at(vllm: Any, rec: Any, temperature: float, top_k: int) -> None:
    """The record's logprobs are those of the distribution at `temperature` and `top_k` (vLLM's raw logprobs of
    the same tokens, scaled and renormalised over the top k), not the raw T=1 ones."""
    raw = rescore(vllm, rec.prompt_ids, rec.completion_ids, top=top_k)
    expected = []
    for position, token in zip(raw, rec.completion_ids, strict=True):
        kept = sorted(position.values(), reverse=True)[:top_k]  # the top-k the sampler kept (+ the sampled one)
        scaled = [lp / temperature for lp in kept]
        peak = max(scaled)
        expected.append(position[token] / temperature - peak - math.log(sum(math.exp(x - peak) for x in scaled)))
    assert max(abs(a - b) for a, b in zip(rec.logprobs, expected, strict=True)) < 1e-3, (rec.logprobs, expected)
    unscaled = own(raw, rec.completion_ids)
    assert max(abs(a - b) for a, b in zip(rec.logprobs, unscaled, strict=True)) > 1e-3  # not the raw T=1 ones


def test_the_jobs_sampling_replaces_the_harnesses_and_is_what_sampled(vllm_server: Any, tmp_path: Path) -> None:
    """spec.inference.sampling (the proxy's --temperature/--top-k): the harness asked for T=1.3 and no top-k;
    vLLM sampled at the job's T=0.5, top-k 20, and the record says so (source `job`), as the trace's spans will."""
    proxy = start_proxy_on_vllm(vllm_server, tmp_path, "exact", sampling=SamplingOverride(temperature=0.5, top_k=20))
    try:
        path, body = dialect_request("chat", vllm_server.model, "Say hello.", 10, temperature=1.3, seed=3)
        assert post(proxy, "chat", path, body).status_code == 200
        (rec,) = proxy.records()
    finally:
        proxy.stop()
    assert rec.sampling == {"temperature": {"value": 0.5, "source": "job"},
                            "top_p": {"value": None, "source": "engine_default"},
                            "top_k": {"value": 20, "source": "job"},
                            "seed": {"value": 3, "source": "request"},
                            "max_tokens": {"value": 10, "source": "request"}}
    assert_sampled_at(vllm_server, rec, 0.5, 20)


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
    again = own(rescore(vllm_server, rec.prompt_ids, rec.completion_ids), rec.completion_ids)
    assert max(abs(a - b) for a, b in zip(rec.logprobs, again, strict=True)) < 1e-4, (rec.logprobs, again)


def test_tool_choice_none_renders_the_same_prompt_in_both_modes(vllm_server: Any, proxies: Any) -> None:
    path, body = dialect_request("chat", vllm_server.model, "Say hello.", 1, tools=TOOLS, tool_choice="none")
    prompts = {}
    for mode in ("server", "exact"):
        assert post(proxies[mode], "chat", path, body).status_code == 200
        prompts[mode] = proxies[mode].records()[-1].prompt_ids
    assert prompts["exact"] == prompts["server"]
