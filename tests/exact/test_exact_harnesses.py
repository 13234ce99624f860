"""Real harnesses, unmodified, through the proxy app in exact mode (scripted engine, SmolLM2 tokenizer).

Each pinned CLI runs headless through its preset in a scratch git repository (the session steps and the
checks every good session passes are shared with tests/proxy/test_harnesses.py, in
tests/fixtures/harness_runs.py). The scripted engine asks for two shell commands and then answers in text.
In exact mode the agent loop's calls must form one exact chain in the capture log: each call's prompt
starts with the previous call's prompt + sampled ids. Other calls a harness makes (titles, summaries,
sub-agents) may start their own roots.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tracefleet.formats.families import load_model_format
from tracefleet.proxy.app import create_app
from tracefleet.proxy.config import ProxyConfig
from tracefleet.proxy.engine_client import EngineClient
from tracefleet.proxy.exact.engine import ExactTokenEngine
from tracefleet.runner.presets import REAL_HARNESSES, get_preset

from fixtures.harness_runs import COMMANDS, FINAL_TEXT, harness_script, run_harness_session, session_problems
from fixtures.servers import serving

ADMIN = "exact-admin-token"


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_HARNESSES)
def test_real_harness_session_is_one_exact_chain(name: str, harness_binaries, scripted_engine, tmp_path: Path) -> None:
    scripted_engine.configure(**harness_script(name))
    engine = ExactTokenEngine(EngineClient(scripted_engine.url), load_model_format("smollm2"))
    config = ProxyConfig(engine_url=scripted_engine.url, capture_dir=tmp_path / "capture", admin_token=ADMIN, mode="exact")
    with serving(create_app(config, token_engine=engine)) as proxy:
        run = run_harness_session(name, port=proxy.port, admin_token=ADMIN, work=tmp_path)
    assert session_problems(run) == [], run.transcript
    recs = run.capture_log().records
    assert all(r.mode == "exact" and not r.tool_parse_errors for r in recs), [(r.mode, r.tool_parse_errors) for r in recs]
    # the agent loop: the calls that asked for the commands and the one that gave the final answer
    loop = [r for r in recs if any(c["name"] == get_preset(name).shell_tool for c in r.tool_calls)
            or FINAL_TEXT in (r.output_text or "")]
    assert len(loop) >= len(COMMANDS) + 1, [(r.call_id, r.tool_calls) for r in recs]
    for prev, cur in zip(loop, loop[1:]):
        served = prev.prompt_ids + prev.completion_ids
        assert cur.prompt_ids[:len(served)] == served, (name, prev.call_id, cur.call_id)
    roots = [r for r in recs if not any(
        r.prompt_ids[:len(p.prompt_ids) + len(p.completion_ids)] == p.prompt_ids + p.completion_ids
        for p in recs if p is not r and p.timings.received_at <= r.timings.received_at)]
    print(f"\n{name}: {len(recs)} calls, {len(loop)} in the agent loop (one exact chain), {len(roots)} roots; "
          f"new-root reasons {engine.new_root_reasons}; reused {engine.stats['reused_tokens']} / rendered "
          f"{engine.stats['rendered_tokens']} prompt tokens")
