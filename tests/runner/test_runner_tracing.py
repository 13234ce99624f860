"""A finished session's rows (tracefleet.runner.tracing.session_traces), what both drivers seal: the
fail-closed rules of tracefleet.contract.semantics on real capture logs written by the CaptureWriter."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracefleet.runner.tracing import NO_TRAINABLE_CALLS, SessionOutcome, session_traces
from tracefleet.traces.batch import table_to_traces, traces_to_table
from tracefleet.traces.synthetic import SyntheticSession


def outcome(**kw: object) -> SessionOutcome:
    base = dict(job="j", session_id="j-s4", task_id="t1", group_id="j/t1", sample_index=1)
    return SessionOutcome(**{**base, **kw})  # type: ignore[arg-type]


def test_a_timeout_after_an_engine_error_and_a_partial_call_is_one_fail_closed_row(tmp_path: Path) -> None:
    """The case that used to seal nothing (its group short): an engine error, then a call broken off
    after 1,625 sampled ids, then the session ran out of time."""
    path = tmp_path / "j-s4.jsonl"
    with SyntheticSession(path, "j-s4", seed=3) as sess:
        sess.call(sess.tokens(40), status="error", error_kind="engine_5xx")
        sess.call(sess.tokens(40), n_completion=1625, status="partial")
    built = session_traces(path, outcome(status="timeout", stage="harness"))
    (row,) = built.traces
    assert row.num_tokens == 0 and row.num_trainable == 0  # nothing trainable: the partial call is dropped
    assert row.meta.reward == 0.0 and row.meta.outcome == "fail_closed"
    assert row.meta.fail_closed_reasons == ["session_timeout:harness", "evaluator_missing", NO_TRAINABLE_CALLS]
    assert (row.meta.group_id, row.meta.task_id, row.meta.sample_index) == ("j/t1", "t1", 1)
    assert built.stats.dropped == {"error:engine_5xx": 1, "partial": 1}  # counted, never silently lost
    (back,) = table_to_traces(traces_to_table([row]))  # and it survives the batch format
    assert back.num_tokens == 0 and back.meta.fail_closed_reasons == row.meta.fail_closed_reasons


def test_a_session_that_failed_after_its_model_call_keeps_its_trace_fail_closed(tmp_path: Path) -> None:
    path = tmp_path / "j-s4.jsonl"
    with SyntheticSession(path, "j-s4", seed=4) as sess:
        sess.call(sess.tokens(30), n_completion=12)
    (trace,) = session_traces(path, outcome(status="error", stage="harness", reward=None)).traces
    assert trace.num_trainable == 12 and trace.meta.outcome == "fail_closed" and trace.meta.reward == 0.0
    assert trace.meta.fail_closed_reasons == ["session_error:harness", "evaluator_missing"]


def test_a_completed_judged_session_is_ok_and_a_failed_judging_is_the_evaluators_reason(tmp_path: Path) -> None:
    path = tmp_path / "j-s4.jsonl"
    with SyntheticSession(path, "j-s4", seed=5) as sess:
        sess.call(sess.tokens(30))
    (ok,) = session_traces(path, outcome(reward=1.0, evaluator_status="ok")).traces
    assert (ok.meta.outcome, ok.meta.reward, ok.meta.fail_closed_reasons) == ("ok", 1.0, [])
    (bad,) = session_traces(path, outcome(status="error", stage="evaluate", reward=0.0, evaluator_status="error")).traces
    assert (bad.meta.outcome, bad.meta.fail_closed_reasons) == ("fail_closed", ["evaluator_error"])
    # no capture at all (a pod that died before uploading): still one row for the group
    (none,) = session_traces(None, outcome(status="error", stage=None)).traces
    assert none.meta.fail_closed_reasons == ["session_error:unknown", "evaluator_missing", NO_TRAINABLE_CALLS]


def test_auxiliary_calls_are_sealed_but_left_out_of_training_by_default(tmp_path: Path) -> None:
    """OpenCode's recorded session (a title call, then the agent's conversation) and a second sample of
    the same task: the title trace is sealed and labelled, but tensors()/advantages() train on the
    conversation only, and the group statistics count each session once, from its conversation."""
    import shutil

    from tracefleet.bucket import LocalBucket
    from tracefleet.traces.reader import BatchReader
    from tracefleet.traces.seal import Sealer

    recorded = Path(__file__).resolve().parents[1] / "traces" / "data" / "recorded-opencode.jsonl"
    rows = []
    for sample, reward in ((0, 1.0), (1, 0.0)):
        capture = tmp_path / f"s{sample}.jsonl"
        shutil.copyfile(recorded, capture)
        rows += session_traces(capture, outcome(session_id=f"j-s{sample}", sample_index=sample, reward=reward,
                                                evaluator_status="ok")).traces
    assert [t.meta.new_root_reason for t in rows] == ["auxiliary", "session_start"] * 2
    bucket = LocalBucket(tmp_path / "bucket")
    Sealer(bucket, "j", spool=tmp_path / "spool").seal(rows)
    batch = BatchReader(bucket, "j").read(0)
    assert batch.table.column("new_root_reason").to_pylist() == ["auxiliary", "session_start"] * 2  # nothing lost
    t = batch.tensors()  # every row, the auxiliary ones not trained
    assert t["trained"].tolist() == [False, True] * 2
    assert t["sequence_advantages"].tolist() == pytest.approx([0.0, 1.0, 0.0, -1.0], abs=1e-4)
    assert batch.advantages().tolist() == pytest.approx([0.0, 1.0, 0.0, -1.0], abs=1e-4)
    everything = batch.tensors(include_auxiliary=True)
    assert everything["trained"].all()
    assert batch.advantages(include_auxiliary=True).tolist() == pytest.approx([1.0, 1.0, -1.0, -1.0], abs=1e-4)


def test_a_session_with_only_auxiliary_traces_still_has_a_row_for_its_group(tmp_path: Path) -> None:
    """The harness generated its title, then failed before its conversation's first call."""
    path = tmp_path / "j-s4.jsonl"
    with SyntheticSession(path, "j-s4", seed=6) as sess:
        sess.call(sess.tokens(30), new_root_reason="auxiliary")
    rows = session_traces(path, outcome(status="error", stage="harness")).traces
    assert [(r.meta.new_root_reason, r.num_tokens > 0) for r in rows] == [("auxiliary", True), (None, False)]
    assert rows[1].meta.trace_id == "j-s4:0001" and NO_TRAINABLE_CALLS in rows[1].meta.fail_closed_reasons
