"""Exact token-in generation against the real CPU engine (SmolLM2 and Gemma 3 on llama.cpp).

A multi-turn conversation through `ExactTokenEngine`: every prompt after the first starts with the
previous prompt + the previous sampled ids, exactly; the logprobs reported while sampling match a
re-score of the full exact sequence (`prompt_logprobs`); deltas stream as they are sampled.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tracefleet.formats.families import load_model_format
from tracefleet.formats.models import TEMPLATES
from tracefleet.proxy.dialects.openai_chat import OpenAIChat
from tracefleet.proxy.engine_client import EngineClient
from tracefleet.proxy.exact.engine import ExactTokenEngine
from tracefleet.proxy.token_engine import CallState

CHAT = OpenAIChat()
# Both models re-score to the same float values (measured max |Δ| 0.0): the engine pins flash attention,
# no weight repacking and a full SWA cache so a token's logits do not depend on batching or cache reuse
# (see tracefleet.engine.llama). The bound leaves room for another CPU's kernels, far below the
# 0.02-0.7 nats that batch-dependent numerics produced on Gemma 3.
TOL = {"smollm2": 1e-3, "gemma3-270m": 1e-3}


def _rescore(engine_url: str, ids: list[int]) -> list[float | None]:
    r = httpx.post(engine_url + "/v1/completions",
                   json={"prompt": ids, "max_tokens": 0, "prompt_logprobs": 0, "temperature": 0}, timeout=120)
    assert r.status_code == 200, r.text
    pls = r.json()["choices"][0]["prompt_logprobs"]
    return [None if p is None else p[str(ids[i])]["logprob"] for i, p in enumerate(pls)]


async def _turn(engine: ExactTokenEngine, body: dict[str, Any], n: int) -> tuple[CallState, list[tuple[str, Any]]]:
    conv = CHAT.parse(body)
    state = CallState(call_id=f"call{n}", session_id="s1", dialect="openai-chat", stream=True, received_at=time.time())
    events = [ev async for ev in engine.generate(conv, state)]
    return state, events


@pytest.mark.parametrize("engine_fixture,model,template", [
    ("cpu_engine", "smollm2", None),
    ("cpu_engine", "smollm2", "qwen3_tools.jinja"),  # a Qwen3-style template on the same tokenizer
    ("gemma_engine", "gemma3-270m", None),
])
async def test_multi_turn_conversation_is_one_exact_chain(engine_fixture, model, template, request):
    cpu_engine = request.getfixturevalue(engine_fixture)
    fmt = load_model_format(model, template_file=TEMPLATES / template if template else None)
    client = EngineClient(cpu_engine.url)
    engine = ExactTokenEngine(client, fmt)
    try:
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You answer in one short sentence."},
                                          {"role": "user", "content": "Name a color."}]
        questions = ["Name a fruit of that color.", "How does it taste?", "Where does it grow?"]
        states: list[CallState] = []
        for n in range(len(questions) + 1):
            body = {"model": model, "messages": messages, "temperature": 0, "max_tokens": 20, "stream": True}
            state, events = await _turn(engine, body, n)
            assert events[0] == ("start", None)
            assert "".join(v for k, v in events if k == "text") == state.output_text
            assert state.completion_ids and len(state.logprobs) == len(state.completion_ids)
            assert state.finish_reason in ("stop", "length")
            info = engine.splice_info(state.call_id)
            assert info is not None
            if n == 0:
                assert info.new_root_reason == "new_conversation"
            else:
                prev = states[-1]
                served = prev.prompt_ids + prev.completion_ids
                assert info.parent_call_id == prev.call_id and info.reused_tokens == len(served)
                assert state.prompt_ids[:len(served)] == served  # byte-for-byte in token space
            states.append(state)
            # the harness echoes the answer with its own whitespace and asks the next question
            messages = messages + [{"role": "assistant", "content": state.output_text.strip() + " "}]
            if n < len(questions):
                messages.append({"role": "user", "content": questions[n]})
        # the engine's sampled logprobs equal a re-score of the exact final sequence
        last = states[-1]
        seq = last.prompt_ids + last.completion_ids
        rescored = _rescore(cpu_engine.url, seq)
        worst = 0.0
        for st in states:
            start = len(st.prompt_ids)
            assert seq[start:start + len(st.completion_ids)] == st.completion_ids
            for i, lp in enumerate(st.logprobs):
                worst = max(worst, abs(rescored[start + i] - lp))
        assert worst <= TOL[model], worst
        stats = engine.stats
        total_prompt = sum(len(s.prompt_ids) for s in states)
        assert stats["spliced"] == len(states) - 1 and stats["new_roots"] == 1
        assert stats["reused_tokens"] + stats["rendered_tokens"] == total_prompt
        print(f"\nexact chain ({model}, {template or 'shipped template'}): {len(states)} calls, prompt tokens {total_prompt}, rendered fresh "
              f"{stats['rendered_tokens']} ({stats['rendered_tokens'] / total_prompt:.0%}), max |Δlogprob| {worst:.2e}")
    finally:
        await client.aclose()


TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def _tool_round(tc: Any, content: str | None, result: str) -> list[dict[str, Any]]:
    """The assistant turn that made tool call `tc`, as a Chat client echoes it, and the tool's result."""
    return [{"role": "assistant", "content": content, "tool_calls": [
        {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments}}]},
        {"role": "tool", "tool_call_id": tc.id, "content": result}]


async def test_tool_call_turn_is_parsed_and_the_result_turn_splices(scripted_engine):
    """The scripted engine answers token-id prompts with hermes tool calls (real SmolLM2 ids)."""
    fmt = load_model_format("smollm2")
    client = EngineClient(scripted_engine.url)
    engine = ExactTokenEngine(client, fmt)
    try:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Write a note."}]
        states = []
        for n in range(3):
            state, events = await _turn(engine, {"model": "smollm2", "messages": messages, "tools": TOOLS, "stream": True}, n)
            states.append(state)
            assert not state.tool_parse_errors
            if n < 2:
                assert state.finish_reason == "tool_calls" and [k for k, _ in events if k == "tool_call"]
                tc = state.tool_calls[0]
                messages = messages + _tool_round(tc, None, f"ok {n}")
            else:
                assert state.finish_reason == "stop" and state.output_text
        for prev, cur in zip(states, states[1:]):
            served = prev.prompt_ids + prev.completion_ids
            assert cur.prompt_ids[:len(served)] == served
        assert engine.stats["spliced"] == 2
    finally:
        await client.aclose()


async def test_malformed_tool_call_is_text_flagged_and_the_chain_continues(scripted_engine):
    scripted_engine.configure(tool_rounds=1, steps=[{"text": '<tool_call>{"name": oops}</tool_call>\n'}])
    fmt = load_model_format("smollm2")
    client = EngineClient(scripted_engine.url)
    engine = ExactTokenEngine(client, fmt)
    try:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Write a note."}]
        state, events = await _turn(engine, {"model": "smollm2", "messages": messages, "tools": TOOLS}, 0)
        assert state.tool_parse_errors and "not valid JSON" in state.tool_parse_errors[0]
        assert '<tool_call>{"name": oops}</tool_call>' in state.output_text  # returned as text, not dropped
        assert [tc.name for tc in state.tool_calls] == ["bash"] and engine.stats["parse_failures"] == 1
        tc = state.tool_calls[0]
        messages += _tool_round(tc, state.output_text, "ok")
        nxt, _ = await _turn(engine, {"model": "smollm2", "messages": messages, "tools": TOOLS}, 1)
        assert nxt.prompt_ids[:len(state.prompt_ids) + len(state.completion_ids)] == state.prompt_ids + state.completion_ids
        assert engine.splice_info("call1").parent_call_id == "call0"
    finally:
        await client.aclose()
