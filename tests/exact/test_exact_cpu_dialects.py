"""Exact mode on the real CPU engine, per dialect: a scripted 10-turn tool-using conversation.

Both shipped models serve it: SmolLM2 with its ChatML template and with a Qwen3-style template (hermes
`<tool_call>` blocks) on the same tokenizer, and Gemma 3 with the template shipped for it. The assistant
turns are scripted by teacher forcing (`PUT /forced/replies`): a 135M model does not call tools on cue,
so the engine emits the scripted tool calls token by token and reports the model's own logprobs for
them. Every prompt token, splice decision and logprob is the real model's; the harness-shaped clients
echo the history back with their usual mutations. The capture log must be one exact chain, and the
logprobs recorded while generating must equal a `prompt_logprobs` re-score of the whole final sequence.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tracefleet.contract.capture import read_capture_log
from tracefleet.formats.families import load_model_format
from tracefleet.formats.models import TEMPLATES
from tracefleet.proxy.app import create_app
from tracefleet.proxy.config import PresetSession, ProxyConfig

from fixtures.dialect_clients import CLIENTS, SECRET, TOOL, TURNS, converse

MODELS = [("cpu_engine", "smollm2", None), ("cpu_engine", "smollm2", "qwen3_tools.jinja"),
          ("gemma_engine", "gemma3-270m", None)]
# Every dialect on SmolLM2's own template and one dialect on each other model/template (6 runs, ~2 min):
# the dialect decides the canonical conversation, the model/template only its rendering and parsing.
# TRACEFLEET_FULL_MATRIX=1 runs all 12 pairs (all pass at max |Δlogprob| 0.0; ~4-5 min on 2 cores).
PAIRS = [(*MODELS[0], d) for d in CLIENTS] + [(*MODELS[1], "anthropic"), (*MODELS[2], "google")]
if os.environ.get("TRACEFLEET_FULL_MATRIX") == "1":
    PAIRS = [(*m, d) for m in MODELS for d in CLIENTS]
TOLERANCE = 1e-3  # measured: 0.0 for both models (engine/llama.py pins batch-independent numerics)
# A re-score of a ~700-token chain costs 10-15 s on one CPU thread, and the dialect only decides which
# tokens the chain holds: each model/template is re-scored in one dialect, a different one each.
RESCORED = {("smollm2", None, "openai-chat"), ("smollm2", "qwen3_tools.jinja", "anthropic"),
            ("gemma3-270m", None, "google")}


def _replies(dialect: str, end_of_turn: str) -> list[str]:
    calls = [f'<tool_call>\n{{"name": "{TOOL[dialect]}", "arguments": {{"command": "echo step {n}"}}}}\n</tool_call>'
             for n in range(TURNS - 1)]
    return [c + end_of_turn for c in calls] + [f"The note is written.{end_of_turn}"]


@pytest.mark.parametrize("engine_fixture,model,template,dialect", PAIRS)
def test_ten_turn_tool_conversation_on_the_cpu_engine_is_one_exact_chain(
        engine_fixture, model, template, dialect, request, tmp_path: Path):
    engine = request.getfixturevalue(engine_fixture)
    template_file = TEMPLATES / template if template else None
    fmt = load_model_format(model, template_file=template_file)
    forced = httpx.put(engine.url + "/forced/replies", json={"replies": _replies(dialect, fmt.family.end_of_turn)})
    assert forced.status_code == 200, forced.text
    try:
        config = ProxyConfig(engine_url=engine.url, capture_dir=tmp_path, admin_token="admin", mode="exact",
                             model_path=model, chat_template_file=template_file,
                             sessions=[PresetSession(session_id="s1", secret=SECRET)])
        calls, metrics = converse(create_app(config), dialect)
        assert httpx.get(engine.url + "/forced/replies").json()["replies"] == []  # one generation per turn
    finally:
        httpx.put(engine.url + "/forced/replies", json={"replies": []})
    assert [len(c) for c in calls] == [1] * (TURNS - 1) + [0], calls
    assert all(c[0][1] == TOOL[dialect] for c in calls[:-1])

    log = read_capture_log(tmp_path / "s1.jsonl")
    recs = log.records
    assert len(recs) == TURNS and not log.torn_tail
    assert all(r.mode == "exact" and r.status == "ok" and not r.tool_parse_errors for r in recs)
    assert recs[0].splice.new_root_reason == "new_conversation"
    for prev, cur in zip(recs, recs[1:]):
        served = prev.prompt_ids + prev.completion_ids
        assert cur.prompt_ids[:len(served)] == served, (dialect, cur.call_id)  # byte-for-byte in token space
        assert cur.splice.parent_call_id == prev.call_id and cur.splice.reused_tokens == len(served)

    assert f'tracefleet_proxy_exact_calls_total{{kind="spliced"}} {TURNS - 1}.0' in metrics
    seq = recs[-1].prompt_ids + recs[-1].completion_ids
    for rec in recs:
        assert seq[len(rec.prompt_ids):len(rec.prompt_ids) + len(rec.completion_ids)] == rec.completion_ids
    if (model, template, dialect) not in RESCORED:
        return
    # the logprobs recorded while generating = a re-score of the exact final sequence
    r = httpx.post(engine.url + "/v1/completions", timeout=300,
                   json={"prompt": seq, "max_tokens": 0, "prompt_logprobs": 0, "temperature": 0})
    assert r.status_code == 200, r.text
    rescored = r.json()["choices"][0]["prompt_logprobs"]
    worst = 0.0
    for rec in recs:
        start = len(rec.prompt_ids)
        for i, (tid, lp) in enumerate(zip(rec.completion_ids, rec.logprobs)):
            worst = max(worst, abs(rescored[start + i][str(tid)]["logprob"] - lp))
    assert worst <= TOLERANCE, worst
    print(f"\n{model} ({template or 'shipped template'}), {dialect}: {TURNS} calls, {len(seq)} tokens in the chain, "
          f"max |Δlogprob| {worst:.1e}")
