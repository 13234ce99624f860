"""Real harnesses, unmodified, through a real `tracefleet proxy` (server mode) against real vLLM.

vLLM runs with the arguments the operator gives it for the same model (the `vllm_server` fixture). The
model is SmolLM2-135M, so the session's task is not expected to succeed: what must hold is the protocol
(the harness sees no wire error and ends by itself; an answer cut at the context's end may be reported as such) and the capture (every call recorded with vLLM's
prompt ids, sampled ids and one logprob per sampled id, as many as vLLM counted). One Chat Completions
harness (Pi, whose prompt is small) and one Responses harness (Codex, ~5k-token prompts that fit the
8192-token context); Claude Code (~21k) and Qwen Code (~19k) do not fit SmolLM2's context.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.harness_runs import capture_problems, run_through_proxy_process

pytestmark = pytest.mark.slow

# A 6.6k-token prefill is ~40 s here, and the model may ramble to the end of the context (~1.6k tokens at 4-10
# tokens/s): 330 s for Codex under heavy load.
HARNESS_TIMEOUT_S = 420
TRUNCATION_REPORT = "reason: max_output_tokens"


@pytest.mark.parametrize("name", ["pi", "codex"])
def test_real_harness_session_on_real_vllm_is_healthy_and_fully_captured(name: str, harness_binaries, vllm_server,
                                                                        tmp_path: Path) -> None:
    run = run_through_proxy_process(name, vllm_server.url, tmp_path, timeout_s=HARNESS_TIMEOUT_S)
    assert not run.timed_out, run.transcript
    recs = run.capture_log().records
    problems = capture_problems(run)
    if recs and recs[-1].finish_reason == "length":
        # SmolLM2 may ramble until the context is full: the harness then reports the cut answer as the provider
        # would (Codex: `turn.failed`, "Incomplete response returned, reason: max_output_tokens"), which is the
        # wire telling the truth, not a protocol error
        problems = [p for p in problems if TRUNCATION_REPORT not in p]
    assert problems == [], run.transcript
    assert all(r.engine_model == vllm_server.model for r in recs), [r.engine_model for r in recs]
    print(f"\n{name} on vLLM: exit {run.exit_code} in {run.duration_s:.0f} s, {len(recs)} calls, prompt tokens "
          f"{[r.prompt_tokens for r in recs]}, sampled {[r.completion_tokens for r in recs]}, "
          f"finish {[r.finish_reason for r in recs]}")
