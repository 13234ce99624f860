"""Builders on capture logs recorded from real harness sessions through the proxy (issue 5 must-show).

The `recorded-<harness>.jsonl` files in tests/traces/data/ were written by a real `tracefleet proxy`
(server mode) while the pinned harness CLI ran headless through its preset against the scripted engine
(SmolLM2's real tokenizer and chat template; two shell tool rounds, then a final text):
`hack/record_fixtures.py` reproduces them, data/README.md says how.

What was observed, and is asserted per harness below:

- codex (Responses), claude-code (Anthropic Messages), qwen-code, pi (Chat Completions) and gemini-cli
  (Google generateContent): three calls - tool call, tool call, final text. Each harness resends its whole
  history and the engine renders it with the same chat template, so prompt[k] begins with
  prompt[k-1] + completion[k-1] token for token (the sampled end-of-turn token included): the history is
  append-only in token space, there is no drift, and prefix-merge builds ONE trace of all three calls.
- opencode: four calls. The first is its title generator (its own system prompt, no tools), which shares
  no prefix with the conversation: an auxiliary call, its own root (`auxiliary`, tracefleet.contract.semantics);
  the three conversation calls then form one chain whose root is the agent's `session_start`.
- No harness re-rendered its history in a way that changed earlier tokens, so drift_splits == 0
  everywhere. That the builder would split (never train across) a re-rendered history is shown on the
  same real logs by perturbing one earlier sampled token in a later prompt, as an engine re-render would.

Independently of the builder, a brute-force oracle (the longest earlier prompt + completion that is an
exact prefix, compared token by token) derives the expected parent of every call; the builder's chains
must agree with it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tracefleet.contract.capture import CaptureLog, CaptureRecord, SpliceInfo, read_capture_log
from tracefleet.runner.presets import get_preset
from tracefleet.traces import BuildResult, SessionInfo, build_traces, table_to_traces, traces_to_table

DATA = Path(__file__).parent / "data"
FINAL_TEXT = "All done: note.txt has both lines."
MAX_FIXTURE_BYTES = 1_000_000

# harness -> (calls, prefix-merge traces, roots by reason); drift_splits is 0 for all of them.
EXPECTED = {
    "codex": (3, 1, {"session_start": 1}),
    "claude-code": (3, 1, {"session_start": 1}),
    "qwen-code": (3, 1, {"session_start": 1}),
    "gemini-cli": (3, 1, {"session_start": 1}),
    "pi": (3, 1, {"session_start": 1}),
    "opencode": (4, 2, {"auxiliary": 1, "session_start": 1}),
}
HARNESSES = list(EXPECTED)


def fixture_path(harness: str) -> Path:
    path = DATA / f"recorded-{harness}.jsonl"
    assert path.is_file(), f"{path} missing: run `.venv/bin/python hack/record_fixtures.py {harness}`"
    return path


def records_of(harness: str) -> list[CaptureRecord]:
    log = read_capture_log(fixture_path(harness))
    assert not log.torn_tail and not log.bad_lines
    return log.records


def full_seq(record: CaptureRecord) -> list[int]:
    return list(record.prompt_ids) + list(record.completion_ids)


def oracle_parents(records: list[CaptureRecord]) -> list[int]:
    """Brute force: the parent of call j is the earlier call whose prompt + completion is the longest exact
    prefix of prompt j (-1 if none). Written without the builder's hashing, token lists compared directly."""
    parents = []
    for j, rec in enumerate(records):
        best, best_len = -1, -1
        for i in range(j):
            seq = full_seq(records[i])
            if len(seq) <= len(rec.prompt_ids) and rec.prompt_ids[: len(seq)] == seq and len(seq) > best_len:
                best, best_len = i, len(seq)
        parents.append(best)
    return parents


def conversation_calls(records: list[CaptureRecord]) -> list[CaptureRecord]:
    """The main conversation: calls that offered the model tools (opencode's title call offers none)."""
    return [r for r in records if (r.request or {}).get("tools")]


def assert_token_fidelity(result: BuildResult, records: list[CaptureRecord]) -> None:
    """Every trainable token and logprob is the capture log's sampled id / logprob, in span order, each
    sampled span preceded by exactly its call's prompt; every ok call is trainable exactly once."""
    by_id = {r.call_id: r for r in records}
    trained: list[str] = []
    for trace in result.traces:
        assert trace.tokens.shape == trace.loss_mask.shape == trace.logprobs.shape
        expected_ids: list[int] = []
        expected_lps: list[float] = []
        for span in trace.spans:
            rec = by_id[span.call_id]
            assert trace.tokens[: span.completion_start].tolist() == rec.prompt_ids
            assert trace.tokens[span.completion_start : span.completion_end].tolist() == rec.completion_ids
            assert span.policy_version == rec.policy_version and span.finish_reason == rec.finish_reason
            expected_ids += rec.completion_ids
            expected_lps += rec.logprobs
            trained.append(span.call_id)
        trainable = trace.loss_mask == 1
        assert trace.tokens[trainable].tolist() == expected_ids
        np.testing.assert_array_equal(trace.logprobs[trainable], np.asarray(expected_lps, dtype=np.float32))
        assert np.isnan(trace.logprobs[~trainable]).all()
        assert int(trainable.sum()) == trace.num_trainable == len(expected_ids)
    assert sorted(trained) == sorted(r.call_id for r in records if r.status == "ok")


def assert_stats_add_up(result: BuildResult, records: list[CaptureRecord]) -> None:
    st = result.stats
    assert st.calls == len(records)
    assert st.kept_calls + sum(st.dropped.values()) == st.calls
    assert st.traces == len(result.traces)
    assert sum(len(t.spans) for t in result.traces) == st.kept_calls
    assert st.trainable_tokens == sum(len(r.completion_ids) for r in records if r.status == "ok")
    assert st.tokens == sum(t.num_tokens for t in result.traces)
    assert st.capture_tokens == sum(len(full_seq(r)) for r in records if r.status == "ok")
    if st.builder == "per-request":
        assert st.traces == st.kept_calls and st.merged_calls == 0 and st.tokens == st.capture_tokens
    else:
        # every trace starts at a root or a branch; every other kept call was merged into a trace
        assert st.traces == sum(st.new_roots.values()) + st.branches
        assert st.merged_calls == st.kept_calls - st.traces
        # a merged trace holds its last call's full sequence once: shared prefixes are never duplicated
        for t in result.traces:
            last = next(r for r in records if r.call_id == t.call_ids[-1])
            assert t.num_tokens == len(full_seq(last))


def test_every_harness_has_a_small_recorded_fixture() -> None:
    for harness in HARNESSES:
        path = fixture_path(harness)
        assert 0 < path.stat().st_size <= MAX_FIXTURE_BYTES, (path, path.stat().st_size)


@pytest.mark.parametrize("harness", HARNESSES)
def test_recorded_session_is_what_the_harness_sent(harness: str) -> None:
    """The fixture is a real session of this harness through the proxy: its dialect, its two tool rounds
    and the final answer, every call complete with token ids and one logprob per sampled id."""
    records = records_of(harness)
    calls, _, _ = EXPECTED[harness]
    assert len(records) == calls
    assert {r.dialect for r in records} == {get_preset(harness).dialect}
    assert {r.mode for r in records} == {"server"}
    assert len({r.session_id for r in records}) == 1
    for r in records:
        assert r.status == "ok" and r.prompt_ids and r.completion_ids
        assert len(r.logprobs) == len(r.completion_ids)
        assert all(lp <= 0.0 for lp in r.logprobs)
        assert not r.tool_parse_errors
    convo = conversation_calls(records)
    assert [r.finish_reason for r in convo] == ["tool_calls", "tool_calls", "stop"]
    assert all(r.tool_calls for r in convo[:2]) and FINAL_TEXT in (convo[2].output_text or "")


@pytest.mark.parametrize("harness", HARNESSES)
def test_per_request_one_trace_per_ok_call(harness: str) -> None:
    records = records_of(harness)
    result = build_traces(fixture_path(harness), builder="per-request", session=SessionInfo(reward=1.0))
    assert result.outcome == "ok"
    assert [t.call_ids for t in result.traces] == [[r.call_id] for r in records if r.status == "ok"]
    for trace, rec in zip(result.traces, records, strict=True):
        assert trace.tokens.tolist() == full_seq(rec)
        assert trace.meta.reward == 1.0
    assert_token_fidelity(result, records)
    assert_stats_add_up(result, records)


@pytest.mark.parametrize("harness", HARNESSES)
def test_prefix_merge_main_conversation_is_one_chain(harness: str) -> None:
    """The conversation's calls form ONE trace (the harness history is append-only in token space through
    the proxy: checked token by token here, not taken from the builder); opencode's title call is a root
    of its own. No drift, no retries, no ambiguity in any of these sessions."""
    records = records_of(harness)
    calls, traces, roots = EXPECTED[harness]
    convo = conversation_calls(records)
    for prev, nxt in zip(convo, convo[1:]):
        assert nxt.prompt_ids[: len(full_seq(prev))] == full_seq(prev), "history not append-only in tokens"

    result = build_traces(fixture_path(harness), builder="prefix-merge", session=SessionInfo(reward=1.0))
    st = result.stats
    assert (st.calls, st.traces, st.drift_splits, st.retries, st.ambiguous, st.branches) == (calls, traces, 0, 0, 0, 0)
    assert st.new_roots == roots and st.dropped == {}
    assert st.merged_calls == len(convo) - 1
    main = [t for t in result.traces if len(t.spans) > 1]
    assert [t.call_ids for t in main] == [[r.call_id for r in convo]]
    assert main[0].meta.finish_reasons == ["tool_calls", "tool_calls", "stop"]
    others = [t.call_ids for t in result.traces if len(t.spans) == 1]
    assert others == [[r.call_id] for r in records if r not in convo]  # opencode: the title call
    if harness == "opencode":
        title = next(t for t in result.traces if t.call_ids == others[0])
        assert title.meta.new_root_reason == "auxiliary"
        assert main[0].meta.new_root_reason == "session_start"

    # The builder's tree equals the brute-force oracle's.
    parents = oracle_parents(records)
    index = {r.call_id: i for i, r in enumerate(records)}
    for t in result.traces:
        ids = [index[c] for c in t.call_ids]
        assert parents[ids[0]] == -1
        assert all(parents[b] == a for a, b in zip(ids, ids[1:]))
    assert_token_fidelity(result, records)
    assert_stats_add_up(result, records)


@pytest.mark.parametrize("harness", HARNESSES)
def test_recorded_traces_survive_the_batch_table(harness: str) -> None:
    """What a trainer reads back (the Arrow table sealed into Parquet) is what the builder made."""
    result = build_traces(fixture_path(harness), session=SessionInfo(reward=0.5, harness=harness))
    back = table_to_traces(traces_to_table(result.traces))
    assert len(back) == len(result.traces)
    for a, b in zip(result.traces, back, strict=True):
        assert a.tokens.tolist() == b.tokens.tolist() and a.loss_mask.tolist() == b.loss_mask.tolist()
        np.testing.assert_array_equal(a.logprobs, b.logprobs)  # NaN (masked) positions compare equal
        assert b.call_ids == a.call_ids and b.meta.harness == harness and b.meta.reward == 0.5


def rerendered(records: list[CaptureRecord], k: int, *, proxy_hint: bool) -> list[CaptureRecord]:
    """The log as if the engine had re-rendered call k-1's sampled completion differently in call k's
    prompt (one token changed; server mode). With `proxy_hint` the record also carries the proxy's
    message-level parent (splice.parent_call_id = call k-1), as a server-mode proxy that tracks the
    conversation records it."""
    out = [r.model_copy(deep=True) for r in records]
    prev, cur = out[k - 1], out[k]
    at = len(prev.prompt_ids) + len(prev.completion_ids) // 2
    cur.prompt_ids[at] = (cur.prompt_ids[at] + 1) % 49152
    if proxy_hint:
        cur.splice = SpliceInfo(parent_call_id=prev.call_id)
    return out


@pytest.mark.parametrize("harness", ["codex", "claude-code", "opencode"])
def test_rerendered_history_in_a_real_log_is_split_never_trained_across(harness: str) -> None:
    """Drift on real logs: the last call's prompt no longer extends the previous call's prompt +
    completion. It still extends the call before (exact), so it continues from there, and the drifted
    call ends its own trace: no trace holds the changed token under the other call's samples. The split
    is counted as drift with the proxy's parent hint and without it (the builder sees that the prompt
    continues the previous call's prompt but not the tokens that call sampled)."""
    records = records_of(harness)
    convo = conversation_calls(records)
    k = records.index(convo[-1])
    prev, before = records[k - 1], records[k - 2]
    for hint in (True, False):
        log = rerendered(records, k, proxy_hint=hint)
        result = build_traces(CaptureLog(records=log), session=SessionInfo(reward=1.0))
        st = result.stats
        assert st.drift_splits == 1
        assert st.branches == 1 and st.traces == EXPECTED[harness][1] + 1
        owner = next(t for t in result.traces if records[k].call_id in t.call_ids)
        assert prev.call_id not in owner.call_ids and owner.call_ids[-2:] == [before.call_id, records[k].call_id]
        assert next(t for t in result.traces if prev.call_id in t.call_ids).call_ids == [prev.call_id]
        assert_token_fidelity(result, log)
        assert_stats_add_up(result, log)
