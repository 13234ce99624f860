"""Builders on synthetic session trees written with the real CaptureWriter, and on any capture log
dropped into tests/traces/data/ (logs recorded from real harness sessions through the proxy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tracefleet.contract.capture import CaptureRecord, read_capture_log
from tracefleet.traces import SessionInfo, Trace, build_traces
from tracefleet.traces.synthetic import SyntheticSession

DATA = Path(__file__).parent / "data"


def assert_fidelity(traces: list[Trace], records: list[CaptureRecord]) -> None:
    """Invariant 1: trainable tokens/logprobs are exactly the sampled ones, each preceded by its prompt."""
    by_id = {r.call_id: r for r in records}
    seen: list[str] = []
    for t in traces:
        assert t.tokens.dtype == np.int32 and t.loss_mask.dtype == np.uint8 and t.logprobs.dtype == np.float32
        assert t.tokens.shape == t.loss_mask.shape == t.logprobs.shape
        expected_mask = np.zeros(t.num_tokens, dtype=np.uint8)
        for span in t.spans:
            rec = by_id[span.call_id]
            assert rec.status == "ok"
            np.testing.assert_array_equal(t.tokens[: span.completion_start], np.asarray(rec.prompt_ids, dtype=np.int32))
            np.testing.assert_array_equal(t.tokens[span.completion_start : span.completion_end], rec.completion_ids)
            np.testing.assert_array_equal(t.logprobs[span.completion_start : span.completion_end],
                                          np.asarray(rec.logprobs, dtype=np.float32))
            assert span.policy_version == rec.policy_version
            expected_mask[span.completion_start : span.completion_end] = 1
            seen.append(span.call_id)
        np.testing.assert_array_equal(t.loss_mask, expected_mask)
        assert np.isnan(t.logprobs[t.loss_mask == 0]).all()
        assert np.isfinite(t.logprobs[t.loss_mask == 1]).all()
    assert len(seen) == len(set(seen)), "a sampled call is trainable in two traces"


def test_linear_session_is_one_trace(tmp_path: Path) -> None:
    s = SyntheticSession(tmp_path / "s.jsonl", "lin")
    prev = s.call(s.tokens(40), 12)
    for k in range(1, 6):
        prev = s.call(s.extend(prev, s.tokens(7)), 9, parent=prev, policy_version=k // 2)
    s.close()
    result = build_traces(tmp_path / "s.jsonl", session=SessionInfo(reward=1.0, group_id="g"))
    assert [len(t.spans) for t in result.traces] == [6]
    st = result.stats
    assert (st.calls, st.kept_calls, st.traces, st.merged_calls, st.retries, st.ambiguous, st.drift_splits) == (6, 6, 1, 5, 0, 0, 0)
    assert st.trainable_tokens == 12 + 5 * 9
    assert result.traces[0].num_tokens == len(s.records[-1].prompt_ids) + 9
    assert result.traces[0].policy_versions == [0, 0, 1, 1, 2, 2]
    assert result.traces[0].meta.reward == 1.0 and result.outcome == "ok"
    assert_fidelity(result.traces, s.records)

    per_req = build_traces(tmp_path / "s.jsonl", builder="per-request")
    assert per_req.stats.traces == 6 and per_req.stats.merged_calls == 0
    assert_fidelity(per_req.traces, s.records)


def test_retry_siblings_never_truncate_the_chain(tmp_path: Path) -> None:
    s = SyntheticSession(tmp_path / "s.jsonl", "retry")
    a = s.call(s.tokens(30), 5)
    p = s.extend(a, s.tokens(6))
    b1 = s.call(p, 5, parent=a)  # the harness retried this prompt
    b2 = s.call(p, 5, parent=a)  # ... and continued from the retry
    c = s.call(s.extend(b2, s.tokens(4)), 5, parent=b2)
    d = s.call(s.extend(c, s.tokens(4)), 5, parent=c)
    s.close()
    result = build_traces(tmp_path / "s.jsonl")
    chains = sorted(t.call_ids for t in result.traces)
    assert chains == sorted([[a.call_id, b2.call_id, c.call_id, d.call_id], [b1.call_id]])
    assert result.stats.retries == 1 and result.stats.branches == 1 and result.stats.traces == 2
    sibling = next(t for t in result.traces if t.call_ids == [b1.call_id])
    assert sibling.meta.branch_of == a.call_id
    assert_fidelity(result.traces, s.records)


def test_compaction_and_sub_agent_start_new_traces(tmp_path: Path) -> None:
    s = SyntheticSession(tmp_path / "s.jsonl", "tree")
    system = s.tokens(50)
    a = s.call(system + s.tokens(10), 6)
    b = s.call(s.extend(a, s.tokens(5)), 6, parent=a)
    # sub-agent: its own system prompt, two turns of its own
    sub1 = s.call(s.tokens(20) + s.tokens(5), 6, new_root_reason="sub-agent")
    sub2 = s.call(s.extend(sub1, s.tokens(3)), 6, parent=sub1)
    # the main agent resumes, then compacts its history into a summary
    c = s.call(s.extend(b, s.tokens(9)), 6, parent=b)
    d = s.call(system + s.tokens(12), 6, new_root_reason="compaction")
    e = s.call(s.extend(d, s.tokens(2)), 6, parent=d)
    s.close()
    result = build_traces(tmp_path / "s.jsonl")
    assert sorted(t.call_ids for t in result.traces) == sorted(
        [[a.call_id, b.call_id, c.call_id], [sub1.call_id, sub2.call_id], [d.call_id, e.call_id]]
    )
    st = result.stats
    assert st.new_roots == {"session_start": 1, "sub-agent": 1, "compaction": 1}
    assert st.merged_calls == 4 and st.traces == 3
    assert_fidelity(result.traces, s.records)


def test_drift_splits_in_server_mode(tmp_path: Path) -> None:
    s = SyntheticSession(tmp_path / "s.jsonl", "drift", mode="server")
    a = s.call(s.tokens(30), 8)
    b = s.call(s.extend(a, s.tokens(5)), 8, parent=a)
    # The engine re-rendered b's completion differently: the prompt no longer extends b's ids.
    drifted = list(b.prompt_ids) + [t + 1 for t in b.completion_ids] + s.tokens(5)
    c = s.call(drifted, 8, parent=b, drift=True)
    d = s.call(s.extend(c, s.tokens(5)), 8, parent=c)
    s.close()
    result = build_traces(tmp_path / "s.jsonl")
    # c still extends a exactly (a's prompt + completion is a prefix of b's prompt), so c continues from a;
    # the chain through b is split at the drift and b's span is never in c's trace as trainable context.
    assert sorted(t.call_ids for t in result.traces) == sorted([[a.call_id, c.call_id, d.call_id], [b.call_id]])
    assert result.stats.drift_splits == 1
    trace = next(t for t in result.traces if c.call_id in t.call_ids)
    assert b.call_id not in trace.call_ids
    assert_fidelity(result.traces, s.records)


def test_drift_is_detected_from_tokens_without_the_flag(tmp_path: Path) -> None:
    s = SyntheticSession(tmp_path / "s.jsonl", "drift2", mode="server")
    a = s.call(s.tokens(30), 8)
    bad = list(a.prompt_ids) + list(a.completion_ids[:-1]) + s.tokens(6)  # last sampled token lost
    s.call(bad, 8, parent=a)  # the proxy believed `a` was the parent; the ids say otherwise
    s.close()
    result = build_traces(tmp_path / "s.jsonl")
    assert result.stats.traces == 2 and result.stats.drift_splits == 1
    assert_fidelity(result.traces, s.records)


def test_ambiguous_parent_is_reported_not_guessed(tmp_path: Path) -> None:
    s = SyntheticSession(tmp_path / "s.jsonl", "amb")
    a = s.call(s.tokens(30), 5)
    p = s.extend(a, s.tokens(6))
    comp = s.tokens(5)
    b1 = s.call(p, completion=comp, parent=a)  # two retries that sampled the very same tokens
    b2 = s.call(p, completion=comp, parent=a)
    c = s.call(s.extend(b2, s.tokens(3)), 5, parent=b2)
    s.close()
    result = build_traces(tmp_path / "s.jsonl")
    st = result.stats
    assert st.ambiguous == 1
    assert st.ambiguous_calls == [{"call_id": c.call_id, "candidates": [b1.call_id, b2.call_id]}]
    owner = next(t for t in result.traces if c.call_id in t.call_ids)
    assert owner.call_ids == [c.call_id] and owner.meta.new_root_reason == "ambiguous"
    assert_fidelity(result.traces, s.records)


def test_failed_and_partial_calls_are_dropped_with_reasons(tmp_path: Path) -> None:
    s = SyntheticSession(tmp_path / "s.jsonl", "drop")
    a = s.call(s.tokens(30), 5)
    s.call(s.extend(a, s.tokens(3)), parent=a, status="error", error_kind="engine_timeout")
    s.call(s.extend(a, s.tokens(3)), 4, parent=a, status="partial")
    b = s.call(s.extend(a, s.tokens(3)), 5, parent=a)
    s.call(s.extend(b, s.tokens(3)), 5, parent=b, logprobs=[-0.1])  # inconsistent record
    s.close()
    result = build_traces(tmp_path / "s.jsonl")
    assert result.stats.dropped == {"error:engine_timeout": 1, "partial": 1, "logprobs_mismatch": 1}
    assert [t.call_ids for t in result.traces] == [[a.call_id, b.call_id]]
    assert_fidelity(result.traces, s.records)


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("torn", "capture_torn_tail"),
        ("tool", "tool_parse_errors"),
        ("evaluator", "evaluator_error"),
        ("incomplete", "capture_incomplete"),
        ("no_reward", "reward_missing"),
    ],
)
def test_fail_closed_sessions_get_no_positive_reward(tmp_path: Path, setup: str, reason: str) -> None:
    path = tmp_path / "s.jsonl"
    s = SyntheticSession(path, "fc")
    a = s.call(s.tokens(20), 5)
    s.call(s.extend(a, s.tokens(3)), 5, parent=a, tool_parse_errors=["<tool_call>{bad json"] if setup == "tool" else None)
    s.close()
    if setup == "torn":
        with open(path, "ab") as f:
            f.write(b'{"call_id": "half')
    info = SessionInfo(
        reward=None if setup == "no_reward" else 1.0,
        evaluator_status="error" if setup == "evaluator" else "ok",
        capture_complete=setup != "incomplete",
    )
    result = build_traces(path, session=info)
    assert result.outcome == "fail_closed" and reason in result.fail_closed_reasons
    for t in result.traces:
        assert t.meta.outcome == "fail_closed" and reason in t.meta.fail_closed_reasons
        assert t.meta.reward is not None and t.meta.reward <= 0.0
    if setup in ("evaluator", "incomplete"):  # the same log with a clean evaluation keeps its reward
        clean = build_traces(path, session=SessionInfo(reward=1.0))
        assert clean.outcome == "ok" and all(t.meta.reward == 1.0 for t in clean.traces)


def test_many_branches_random_tree_fidelity(tmp_path: Path) -> None:
    """A random tree (branches, retries, roots) keeps every kept call trainable exactly once."""
    rng = np.random.default_rng(7)
    s = SyntheticSession(tmp_path / "s.jsonl", "rand", seed=3)
    recs = [s.call(s.tokens(25), 4)]
    for _ in range(120):
        r = rng.random()
        if r < 0.1:
            recs.append(s.call(s.tokens(int(rng.integers(5, 40))), 4, new_root_reason="sub-agent"))
        else:
            parent = recs[int(rng.integers(0, len(recs)))]
            recs.append(s.call(s.extend(parent, s.tokens(int(rng.integers(1, 6)))), int(rng.integers(1, 6)), parent=parent))
    s.close()
    result = build_traces(tmp_path / "s.jsonl")
    assert sum(len(t.spans) for t in result.traces) == 121
    assert result.stats.ambiguous == 0
    assert_fidelity(result.traces, s.records)


def _real_logs() -> list[Path]:
    # synthetic-*.jsonl was written by CaptureWriter (tracefleet.traces.synthetic); logs recorded by the
    # proxy from real harness sessions are dropped next to it and picked up here.
    logs = sorted(DATA.glob("*.jsonl"))
    assert logs, f"no capture logs in {DATA}"
    return logs


@pytest.mark.parametrize("path", _real_logs(), ids=lambda p: p.name)
def test_recorded_capture_logs(path: Path) -> None:
    """Capture logs recorded through the proxy (committed fixtures): both builders keep fidelity and the
    stats account for every call."""
    log = read_capture_log(path)
    for builder in ("prefix-merge", "per-request"):
        result = build_traces(path, builder=builder, session=SessionInfo(reward=1.0))
        st = result.stats
        assert st.calls == len(log.records)
        assert st.kept_calls + sum(st.dropped.values()) == st.calls
        assert sum(len(t.spans) for t in result.traces) == st.kept_calls
        assert_fidelity(result.traces, log.records)


def test_retries_of_abandoned_calls_are_siblings_never_a_chain(tmp_path: Path) -> None:
    """A harness that gives up on a call and retries it (Qwen Code on its client timeout): the abandoned
    attempts are in the log (a partial one with what the engine had sampled, an errored one with none)
    and never parents; the retry that was answered continues the chain from the attempts' own parent."""
    from tracefleet.traces.calls import calls_from_records
    from tracefleet.traces.merge import build_tree
    from tracefleet.traces.schema import ReconstructionStats

    s = SyntheticSession(tmp_path / "s.jsonl", "abandon")
    a = s.call(s.tokens(30), 5)
    p = s.extend(a, s.tokens(6))
    s.call(p, 3, parent=a, status="partial")  # cut off mid-generation
    s.call(p, parent=a, status="error", error_kind="client_disconnect")  # abandoned before its first token
    retry = s.call(p, 5, parent=a)
    c = s.call(s.extend(retry, s.tokens(4)), 5, parent=retry)
    s.close()
    log = read_capture_log(tmp_path / "s.jsonl")
    assert [r.prompt_ids == p for r in log.records] == [False, True, True, True, False]  # the log shows the attempts
    result = build_traces(tmp_path / "s.jsonl")
    assert [t.call_ids for t in result.traces] == [[a.call_id, retry.call_id, c.call_id]]
    assert result.stats.dropped == {"partial": 1, "error:client_disconnect": 1}
    assert_fidelity(result.traces, s.records)
    # The rule itself: an attempt that sampled tokens is a sibling of its retry, not its parent ...
    calls = calls_from_records(log.records)
    tree = build_tree([calls[0], calls[1], calls[3]], ReconstructionStats())
    assert tree.parent == [-1, 0, 0] and tree.retry_of == [-1, -1, 1]
    # ... whereas one that sampled nothing would be (its prompt + nothing is the retry's prompt): dropping it matters
    tree = build_tree([calls[0], calls[2], calls[3]], ReconstructionStats())
    assert tree.parent == [-1, 0, 1]


def test_spans_carry_the_sampling_parameters_and_flagged_calls_are_not_trained_on() -> None:
    from tracefleet.contract.capture import Timings
    from tracefleet.traces.batch import table_to_traces, traces_to_table
    from tracefleet.traces.build import build_from_calls
    from tracefleet.traces.calls import calls_from_records

    def record(call_id: str, prompt: list[int], out: list[int], **extra: object) -> CaptureRecord:
        return CaptureRecord(call_id=call_id, session_id="s", dialect="openai-chat", timings=Timings(received_at=0.0),
                             prompt_ids=prompt, completion_ids=out, logprobs=[-0.5] * len(out), finish_reason="stop",
                             **extra)

    sampling = {"temperature": {"value": 0.7, "source": "request"}, "top_p": {"value": None, "source": "engine_default"},
                "top_k": {"value": 20, "source": "request"}}
    first = record("a", [1, 2, 3], [4, 5], sampling=sampling)
    second = record("b", [1, 2, 3, 4, 5, 6], [7, 8], sampling=sampling, flags=["token_count_mismatch"])
    result = build_from_calls(calls_from_records([first, second]))
    assert result.stats.dropped == {"flagged:token_count_mismatch": 1}
    (trace,) = table_to_traces(traces_to_table(result.traces))
    (span,) = trace.spans
    assert (span.call_id, span.temperature, span.top_p, span.top_k) == ("a", 0.7, None, 20)


def test_a_guided_prefix_is_context_in_the_trace_never_a_trainable_token(tmp_path: Path) -> None:
    """The guide answers the session's first two calls (CaptureRecord.guided): their completions stay in the trace as
    what the policy's calls were conditioned on, with loss mask 0, no logprobs, no span and no policy version."""
    s = SyntheticSession(tmp_path / "s.jsonl", "guided")
    guide_1 = s.call(s.tokens(30), 6, guided=True)
    guide_2 = s.call(s.extend(guide_1, s.tokens(5)), 7, parent=guide_1, guided=True)
    policy_1 = s.call(s.extend(guide_2, s.tokens(4)), 9, parent=guide_2, policy_version=3)
    policy_2 = s.call(s.extend(policy_1, s.tokens(4)), 5, parent=policy_1, policy_version=3)
    s.close()
    for builder in ("prefix-merge", "per-request"):
        result = build_traces(tmp_path / "s.jsonl", builder=builder, session=SessionInfo(reward=1.0, group_id="g"))
        sampled = [t for t in result.traces if t.spans]
        assert [span.call_id for t in sampled for span in t.spans] == [policy_1.call_id, policy_2.call_id]
        assert result.stats.trainable_tokens == 9 + 5
        assert_fidelity(result.traces, s.records)
        for t in result.traces:
            versions = t.token_versions()
            assert (versions[t.loss_mask == 0] == -1).all() and set(versions[t.loss_mask == 1].tolist()) <= {3}
    merged = build_traces(tmp_path / "s.jsonl", session=SessionInfo(reward=1.0, group_id="g")).traces
    assert len(merged) == 1
    trace = merged[0]
    guide_end = len(guide_2.prompt_ids) + len(guide_2.completion_ids)
    np.testing.assert_array_equal(trace.tokens[:guide_end], guide_2.prompt_ids + guide_2.completion_ids)
    assert not trace.loss_mask[:guide_end].any() and np.isnan(trace.logprobs[:guide_end]).all()
    assert trace.spans[0].prompt_start == 0, "the policy's first call's context holds the guide's turns"
    assert trace.policy_versions == [3, 3]
