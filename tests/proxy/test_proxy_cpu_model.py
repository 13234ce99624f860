"""A real model behind the proxy: SmolLM2-135M-Instruct on llama.cpp (the CPU engine). Every
dialect, streamed and not, greedy: the ids and logprobs the proxy captured equal what the engine
answers for the same conversation when called directly."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tracefleet.contract.capture import read_capture_log
from tracefleet.proxy.canonical import Conversation
from tracefleet.proxy.token_engine import engine_messages

QUESTION = "Name three colors."
N = 12


def ask(base: str, key: str, dialect: str, stream: bool) -> str:
    """One call with raw HTTP; returns the answer text as the client would assemble it."""
    if dialect == "openai-chat":
        body = {"model": "x", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": N, "temperature": 0, "stream": stream}
        r = httpx.post(base + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=120)
        if not stream:
            return r.json()["choices"][0]["message"]["content"]
        out = ""
        for line in r.text.split("\n"):
            if line.startswith("data: {"):
                for ch in orjson.loads(line[6:])["choices"]:
                    out += ch["delta"].get("content") or ""
        return out
    if dialect == "openai-responses":
        body = {"model": "x", "input": QUESTION, "max_output_tokens": N, "temperature": 0, "stream": stream}
        r = httpx.post(base + "/v1/responses", json=body, headers={"authorization": f"Bearer {key}"}, timeout=120)
        if not stream:
            return r.json()["output"][0]["content"][0]["text"]
        return "".join(orjson.loads(l[6:])["delta"] for l in r.text.split("\n") if '"response.output_text.delta"' in l and l.startswith("data: "))
    if dialect == "anthropic":
        body = {"model": "x", "max_tokens": N, "temperature": 0, "messages": [{"role": "user", "content": QUESTION}], "stream": stream}
        r = httpx.post(base + "/v1/messages", json=body, headers={"x-api-key": key}, timeout=120)
        if not stream:
            return r.json()["content"][0]["text"]
        return "".join(orjson.loads(l[6:])["delta"]["text"] for l in r.text.split("\n") if '"text_delta"' in l and l.startswith("data: "))
    body = {"contents": [{"role": "user", "parts": [{"text": QUESTION}]}], "generationConfig": {"maxOutputTokens": N, "temperature": 0}}
    action = "streamGenerateContent?alt=sse" if stream else "generateContent"
    r = httpx.post(base + f"/v1beta/models/x:{action}", json=body, headers={"x-goog-api-key": key}, timeout=120)
    if not stream:
        return r.json()["candidates"][0]["content"]["parts"][0]["text"]
    return "".join(p.get("text", "") for l in r.text.split("\r\n") if l.startswith("data: ")
                   for p in orjson.loads(l[6:])["candidates"][0]["content"]["parts"])


@pytest.mark.parametrize("dialect", ["openai-chat", "openai-responses", "anthropic", "google"])
def test_real_model_capture_matches_engine(cpu_engine, start_proxy, dialect):
    proxy = start_proxy(cpu_engine.url)
    s = proxy.new_session()
    texts = [ask(proxy.url, s["secret"], dialect, stream) for stream in (False, True)]
    assert texts[0] and texts[0] == texts[1]  # greedy: streamed and whole answers agree
    recs = read_capture_log(proxy.capture_dir / f"{s['session_id']}.jsonl").records
    assert [r.stream for r in recs] == [False, True] and all(r.status == "ok" for r in recs)
    for rec, text in zip(recs, texts, strict=True):
        assert rec.output_text == text and len(rec.completion_ids) == len(rec.logprobs) > 0
        conv = Conversation.model_validate(rec.canonical)
        direct = httpx.post(cpu_engine.url + "/v1/chat/completions", timeout=120, json={
            "model": cpu_engine.model, "messages": engine_messages(conv), "max_tokens": N, "temperature": 0,
            "return_token_ids": True, "logprobs": True}).json()
        choice = direct["choices"][0]
        assert rec.prompt_ids == direct["prompt_token_ids"]
        assert rec.completion_ids == choice["token_ids"]
        assert rec.logprobs == pytest.approx([c["logprob"] for c in choice["logprobs"]["content"]], abs=1e-4)
        assert choice["message"]["content"] == text
