"""Exact mode through the real proxy app, per dialect: a scripted 10-turn tool-using conversation.

Every dialect's harness-shaped client echoes the history back in its own wire format (with the usual
mutations: compact re-serialised arguments, moved cache markers, block lists vs strings, echoed
reasoning). The capture log must show one exact chain: each prompt = previous prompt + previous sampled
ids + new tokens, and the recorded logprobs equal a re-score of the exact sequence.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tracefleet.contract.capture import read_capture_log
from tracefleet.formats.families import load_model_format
from tracefleet.proxy.app import create_app
from tracefleet.proxy.config import PresetSession, ProxyConfig
from tracefleet.proxy.engine_client import EngineClient
from tracefleet.proxy.exact.engine import ExactTokenEngine
from tracefleet.proxy.exact.metrics import register_exact_metrics

from fixtures.dialect_clients import CLIENTS, SECRET, TURNS, converse

@pytest.fixture(scope="module")
def smollm2_format():
    return load_model_format("smollm2")


@pytest.mark.parametrize("dialect", list(CLIENTS))
def test_ten_turn_tool_conversation_is_one_exact_chain(dialect, scripted_engine, smollm2_format, tmp_path: Path):
    scripted_engine.configure(tool_rounds=TURNS - 1)
    config = ProxyConfig(engine_url=scripted_engine.url, capture_dir=tmp_path, admin_token="admin", mode="exact",
                         sessions=[PresetSession(session_id="s1", secret=SECRET)])
    engine = ExactTokenEngine(EngineClient(scripted_engine.url), smollm2_format)
    app = create_app(config, token_engine=engine)
    register_exact_metrics(app.state.proxy.metrics.registry, engine)
    calls, metrics = converse(app, dialect)
    assert [len(c) for c in calls] == [1] * (TURNS - 1) + [0], calls
    log = read_capture_log(tmp_path / "s1.jsonl")
    recs = log.records
    assert len(recs) == TURNS and not log.torn_tail
    assert all(r.mode == "exact" and r.status == "ok" and not r.tool_parse_errors for r in recs)
    for prev, cur in zip(recs, recs[1:]):
        served = prev.prompt_ids + prev.completion_ids
        assert cur.prompt_ids[:len(served)] == served, (dialect, cur.call_id)
    # sampled logprobs = a re-score of the whole exact sequence (scripted logprobs depend on position and id)
    seq = recs[-1].prompt_ids + recs[-1].completion_ids
    r = httpx.post(scripted_engine.url + "/v1/completions",
                   json={"prompt": seq, "max_tokens": 0, "prompt_logprobs": 0}, timeout=60)
    pls = r.json()["choices"][0]["prompt_logprobs"]
    for rec in recs[:-1]:
        start = len(rec.prompt_ids)
        assert rec.logprobs == [pls[start + i][str(t)]["logprob"] for i, t in enumerate(rec.completion_ids)]
    s = engine.stats
    assert s["spliced"] == TURNS - 1 and s["new_roots"] == 1 and s["parse_failures"] == 0
    total = sum(len(r.prompt_ids) for r in recs)
    assert f'tracefleet_proxy_exact_calls_total{{kind="spliced"}} {TURNS - 1}.0' in metrics
    assert 'tracefleet_proxy_exact_new_roots_total{reason="new_conversation"} 1.0' in metrics
    ratio = float(metrics.split("\ntracefleet_proxy_exact_splice_hit_ratio ")[1].split()[0])
    assert ratio == s["reused_tokens"] / total > 0.8
    print(f"\n{dialect}: {TURNS} calls, {total} prompt tokens, {s['rendered_tokens']} rendered fresh, "
          f"{s['drift_avoided']} calls where a re-render would have drifted")


# -- wiring: `ProxyConfig(mode="exact")` alone selects the exact engine ----------------------------
@pytest.mark.parametrize("dialect", list(CLIENTS))
def test_config_selects_exact_mode_and_records_splices(dialect, scripted_engine, tmp_path: Path):
    scripted_engine.configure(tool_rounds=TURNS - 1)
    config = ProxyConfig(engine_url=scripted_engine.url, capture_dir=tmp_path, admin_token="admin", mode="exact",
                         model_path="smollm2", sessions=[PresetSession(session_id="s1", secret=SECRET)])
    app = create_app(config)
    assert app.state.proxy.engine.mode == "exact"
    _, metrics = converse(app, dialect)
    recs = read_capture_log(tmp_path / "s1.jsonl").records
    assert len(recs) == TURNS and all(r.mode == "exact" for r in recs)
    assert recs[0].splice.new_root_reason == "new_conversation" and recs[0].splice.parent_call_id is None
    for prev, cur in zip(recs, recs[1:]):
        served = prev.prompt_ids + prev.completion_ids
        assert cur.splice.parent_call_id == prev.call_id and cur.splice.new_root_reason is None
        assert cur.splice.reused_tokens == len(served) and cur.prompt_ids[:len(served)] == served
        assert cur.splice.reused_tokens + cur.splice.rendered_tokens == len(cur.prompt_ids)
    assert f'tracefleet_proxy_exact_calls_total{{kind="spliced"}} {TURNS - 1}.0' in metrics


def test_exact_mode_without_a_model_is_a_clear_error(tmp_path: Path):
    with pytest.raises(ValueError, match="model_path"):
        create_app(ProxyConfig(engine_url="http://127.0.0.1:9", capture_dir=tmp_path, admin_token="a", mode="exact"))
