"""Against real vLLM (the session's `vllm_server`): what each dialect's call records, in both capture modes.

For every dialect, streamed and not, with tools in the dialect's own shape, the same harness request goes
through the server-mode proxy (vLLM renders the prompt and returns its prompt ids) and the exact-mode proxy
(tracefleet renders, sends ids). The checks are the issue's: the captured prompt ids are vLLM's (exact mode's
rendering equals the one vLLM made for the same request), the sampled ids and logprobs are vLLM's (equal to a
`prompt_logprobs` re-score of the whole sequence; greedy, so processed and raw logprobs agree), and
len(ids) == usage.completion_tokens == len(logprobs) on every call.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from fixtures.proxy_on_vllm import auth_headers, dialect_request, proxies  # noqa: F401 (a fixture)

SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOLS = {
    "chat": {"tools": [{"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                                         "parameters": SCHEMA}}]},
    "responses": {"tools": [{"type": "function", "name": "bash", "description": "Run a shell command",
                             "parameters": SCHEMA}]},
    "anthropic": {"tools": [{"name": "bash", "description": "Run a shell command", "input_schema": SCHEMA}]},
    "google": {"tools": [{"functionDeclarations": [{"name": "bash", "description": "Run a shell command",
                                                    "parameters": SCHEMA}]}]},
}
MAX_TOKENS = 12


def call(proxy: Any, dialect: str, model: str, stream: bool) -> Any:
    """One harness-shaped call with tools; the record it left."""
    path, body = dialect_request(dialect, model, "List the files in the current directory.", MAX_TOKENS,
                                 **TOOLS[dialect])
    if stream and dialect == "google":
        path = path.replace(":generateContent", ":streamGenerateContent?alt=sse")
    elif stream:
        body["stream"] = True
    with httpx.stream("POST", proxy.url + path, json=body, headers=auth_headers(dialect), timeout=120) as r:
        r.read()
        assert r.status_code == 200, r.text
    return proxy.records()[-1]


def rescore(vllm: Any, prompt_ids: list[int], ids: list[int]) -> list[float]:
    r = httpx.post(vllm.url + "/v1/completions", json={"model": vllm.model, "prompt": prompt_ids + ids, "max_tokens": 1,
                                                      "prompt_logprobs": 0}, timeout=120).raise_for_status().json()
    scored = r["choices"][0]["prompt_logprobs"][len(prompt_ids):]
    return [scored[i][str(t)]["logprob"] for i, t in enumerate(ids)]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic", "google"])
def test_each_dialect_records_vllms_prompt_ids_sampled_ids_and_logprobs(vllm_server: Any, proxies: Any,
                                                                        dialect: str, stream: bool) -> None:
    recs = {mode: call(proxies[mode], dialect, vllm_server.model, stream) for mode in ("server", "exact")}
    for mode, rec in recs.items():
        assert rec.status == "ok" and rec.flags == [] and rec.stream == stream, (mode, rec)
        assert len(rec.completion_ids) == rec.completion_tokens == len(rec.logprobs) > 0, (mode, rec)
        again = rescore(vllm_server, rec.prompt_ids, rec.completion_ids)
        assert max(abs(a - b) for a, b in zip(rec.logprobs, again, strict=True)) < 1e-4, (mode, rec.logprobs, again)
    # server mode's prompt ids are the ones vLLM rendered; exact mode rendered the same tokens itself
    assert recs["exact"].prompt_ids == recs["server"].prompt_ids
