"""Per-token policy versions from the capture record to the trainer's tensors: a call that straddled a weight
update keeps one span per version in its trace, the reader spreads them over the tokens and bounds staleness,
and the proxy's split at the engine's version marks (tracefleet.proxy.versions) puts each token on the side
of the mark it arrived on. The same path against real vLLM: tests/vllm/test_vllm_policy_update.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tracefleet.bucket import LocalBucket
from tracefleet.contract.policy import VersionMark, decode_label, encode_label, label_version, policy_spans
from tracefleet.proxy.token_engine import CallState
from tracefleet.proxy.versions import VERSION_UNKNOWN, EngineVersions, TimedTokens
from tracefleet.traces import BatchReader, Sealer, SessionInfo, build_traces
from tracefleet.traces.synthetic import SyntheticSession

MARK = 1_800_000_000.0


def test_labels_round_trip_and_name_their_newest_version() -> None:
    marks = [VersionMark(version=2, at=MARK + 5), VersionMark(version=1, at=MARK)]
    label = encode_label(marks)
    assert label == f"2@{MARK + 5:.3f} 1@{MARK:.3f}" and decode_label(label) == marks
    assert [label_version(x) for x in (label, "7", "default", "policy-1", None)] == [2, 7, None, None, None]
    # spans that do not tile the output are not trusted: the admission version for all of it
    assert policy_spans([{"version": "1", "start": 0, "end": 3}], 0, 5) == [(0, 0, 5)]
    assert policy_spans([{"version": "default", "start": 0, "end": 3}, {"version": label, "start": 3, "end": 5}], 0, 5) \
        == [(0, 0, 3), (2, 3, 5)]


def _state(arrivals: list[tuple[int, float]], **kw: object) -> CallState:
    state = CallState(call_id="c", session_id="s", dialect="openai-chat", stream=True, received_at=MARK - 10,
                      completion_ids=TimedTokens(), **kw)  # type: ignore[arg-type]
    for count, t in arrivals:
        state.completion_ids.extend([7] * (count - len(state.completion_ids)))
        state.completion_ids.arrivals[-1] = (count, t)
    return state


def test_the_proxy_splits_a_call_at_the_mark_its_tokens_arrived_around() -> None:
    versions = EngineVersions(client=None)  # type: ignore[arg-type]
    versions.marks = [VersionMark(version=4, at=MARK + 20), VersionMark(version=3, at=MARK)]
    # keep-paused at MARK-1 (load ~1 s), resumed at MARK + 0.05: tokens on both sides, then a second update
    state = _state([(2, MARK - 3), (5, MARK - 1.0), (6, MARK + 0.08), (9, MARK + 5), (10, MARK + 20.1)])
    versions.stamp(state)
    assert state.weight_versions == [{"version": "default", "start": 0, "end": 5},
                                     {"version": "3", "start": 5, "end": 9, "margin_s": 0.08},
                                     {"version": "4", "start": 9, "end": 10, "margin_s": 0.1}]
    assert versions.current(0) == 4
    # answered whole: no arrival times; a run across a mark cannot be split and is kept out of training
    whole = CallState(call_id="w", session_id="s", dialect="openai-chat", stream=False, received_at=MARK - 2,
                      engine_sent_at=MARK - 2, done_at=MARK + 1, completion_ids=[1, 2, 3])
    versions.stamp(whole)
    assert whole.weight_versions is None and whole.flags == [VERSION_UNKNOWN]
    after = CallState(call_id="a", session_id="s", dialect="openai-chat", stream=False, received_at=MARK + 1,
                      engine_sent_at=MARK + 1, done_at=MARK + 2, completion_ids=[1, 2, 3])
    versions.stamp(after)
    assert after.weight_versions == [{"version": "3", "start": 0, "end": 3}]


def test_a_straddling_call_keeps_both_spans_and_the_reader_bounds_staleness(tmp_path: Path) -> None:
    s = SyntheticSession(tmp_path / "s.jsonl", "s")
    a = s.call(s.tokens(6), 4, policy_version=0)
    label = encode_label([VersionMark(version=1, at=MARK)])
    b = s.call(s.extend(a, s.tokens(3)), 6, policy_version=0,
               weight_versions=[{"version": "default", "start": 0, "end": 2}, {"version": label, "start": 2, "end": 6}])
    result = build_traces(s.path, session=SessionInfo(job="j", task_id="t", group_id="t", sample_index=0, reward=1.0))
    (trace,) = result.traces
    assert trace.call_ids == [a.call_id, b.call_id]
    assert [(sp.call_id, sp.policy_version, sp.completion_end - sp.completion_start) for sp in trace.spans] == \
        [(a.call_id, 0, 4), (b.call_id, 0, 2), (b.call_id, 1, 4)]
    v = trace.token_versions()
    assert (v[trace.loss_mask == 0] == -1).all() and v[trace.loss_mask == 1].tolist() == [0] * 6 + [1] * 4
    # the sampled tokens and logprobs are still exactly the records' (the split changes no token)
    assert trace.tokens[trace.loss_mask == 1].tolist() == a.completion_ids + b.completion_ids
    np.testing.assert_array_equal(trace.logprobs[trace.loss_mask == 1], np.float32(a.logprobs + b.logprobs))

    bucket = LocalBucket(tmp_path / "bucket")
    Sealer(bucket, "j", spool=tmp_path / "spool").seal(result.traces)
    batch = BatchReader(bucket, "j").read(0)
    t = batch.tensors()
    n = trace.num_tokens
    assert t["token_versions"][0, :n].tolist() == v.tolist()
    masked = batch.tensors(min_policy_version=1)
    assert masked["loss_mask"][0].sum().item() == 4 and (masked["token_versions"][0][masked["loss_mask"][0] > 0] == 1).all()
    assert batch.tensors(max_lag=0)["loss_mask"][0].sum().item() == 4
    assert not batch.tensors(min_policy_version=1, stale="drop")["trained"].any()  # still there, not trained
    assert batch.tensors(min_policy_version=0, stale="drop")["loss_mask"][0].sum().item() == 10
