"""Outcome kinds (tracefleet.contract.semantics, docs/training/outcomes.md): every fail-closed reason is the
policy's (reward <= 0, counted) or the infrastructure's (left out of the group statistics and the loss like a
quarantined row, counted in the manifest); the rows say which (`outcome_kind`), both drivers build them with
session_traces, and BatchReader leaves the infrastructure's out unless asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracefleet.bucket import LocalBucket
from tracefleet.contract.semantics import OutcomeCounts, OutcomeKind, outcome_counts, outcome_kind, session_failure_reason
from tracefleet.runner.tracing import NO_TRAINABLE_CALLS, SessionOutcome, session_traces
from tracefleet.traces.advantages import group_advantages
from tracefleet.traces.reader import BatchReader
from tracefleet.traces.seal import Sealer
from tracefleet.traces.synthetic import SyntheticSession

POLICY, INFRA, OK = OutcomeKind.POLICY, OutcomeKind.INFRASTRUCTURE, OutcomeKind.OK

# the rule table of docs/training/outcomes.md: reasons (as a row carries them) -> kind, with and without an
# answered model call
TABLE = [
    ((), True, OK),
    (("session_timeout:harness",), True, POLICY),
    (("session_error:harness", "evaluator_missing"), True, POLICY),  # the harness failed after the model answered
    (("session_error:harness", "evaluator_missing", NO_TRAINABLE_CALLS), False, INFRA),  # before any answer
    (("session_timeout:harness", "evaluator_missing", NO_TRAINABLE_CALLS), False, INFRA),
    (("session_error:collect",), True, POLICY),  # the agent can break its workspace's git
    (("session_error:unknown", "evaluator_missing"), True, POLICY),  # a pod that left no result, after its calls
    (("session_error:prepare", "evaluator_missing", NO_TRAINABLE_CALLS), False, INFRA),
    (("session_error:register", "evaluator_missing", NO_TRAINABLE_CALLS), False, INFRA),
    (("session_error:capture", "capture_incomplete", "evaluator_missing"), True, INFRA),
    (("capture_torn_tail",), True, INFRA),
    (("capture_bad_lines",), True, INFRA),
    (("evaluator_unavailable",), True, INFRA),
    (("evaluator_missing",), True, INFRA),  # a completed session whose verdict was lost
    (("reward_missing",), True, INFRA),
    (("evaluator_error",), True, POLICY),
    (("evaluator_timeout",), True, POLICY),
    (("tool_parse_errors",), True, POLICY),
    (("tool_parse_errors", "evaluator_unavailable"), True, POLICY),  # fail-closed whatever the judge said
    (("capture_torn_tail", "evaluator_error"), True, POLICY),
    ((NO_TRAINABLE_CALLS,), True, POLICY),  # a completed session without a trainable call
    ((NO_TRAINABLE_CALLS,), False, INFRA),  # ...in which the engine answered nothing: the policy never acted
    (("evaluator_error", NO_TRAINABLE_CALLS), False, INFRA),
    ((), False, OK),
    (("dropped_by_diagnostics",), True, POLICY),
    (("some_reason_not_classified_yet",), True, POLICY),  # fail closed
]


@pytest.mark.parametrize(("reasons", "answered", "kind"), TABLE)
def test_every_fail_closed_reason_has_one_kind(reasons: tuple[str, ...], answered: bool, kind: OutcomeKind) -> None:
    assert outcome_kind(reasons, model_answered=answered) is kind


def test_the_reasons_of_every_session_stage_are_classified() -> None:
    for stage in ("prepare", "register", "harness", "collect", "evaluate", "capture", "build", None):
        for status in ("error", "timeout"):
            reason = session_failure_reason(status, stage)
            if reason is not None:
                ours = stage in ("prepare", "register", "capture", "build")
                assert outcome_kind([reason]) is (INFRA if ours else POLICY), reason
                assert outcome_kind([reason], model_answered=False) is INFRA, reason


def _session(tmp_path: Path, sample: int, reward: float | None, *, evaluator: str = "ok", status: str = "completed",
             stage: str | None = None, answered: bool = True) -> list:
    path = tmp_path / f"j-s{sample}.jsonl"
    with SyntheticSession(path, f"j-s{sample}", seed=sample) as sess:
        if answered:
            sess.call(sess.tokens(30), n_completion=8)
        else:
            sess.call(sess.tokens(30), status="error", error_kind="engine_unavailable")
    outcome = SessionOutcome(job="j", session_id=f"j-s{sample}", task_id="t", group_id="j/t", sample_index=sample,
                             reward=reward, evaluator_status=evaluator, status=status, stage=stage)
    return session_traces(path, outcome).traces


def test_rows_carry_their_kind_and_the_reader_leaves_the_infrastructures_out(tmp_path: Path) -> None:
    judged_down = _session(tmp_path, 0, 0.0, evaluator="unavailable")  # its evaluator could not run
    solved = _session(tmp_path, 1, 1.0)
    failed = _session(tmp_path, 2, 0.0)
    gave_up = _session(tmp_path, 3, None, evaluator="missing", status="timeout", stage="harness")  # the policy's
    engine_down = _session(tmp_path, 4, None, evaluator="missing", status="error", stage="harness", answered=False)
    assert [t.meta.outcome_kind for t in judged_down] == [INFRA] and judged_down[0].meta.reward == 0.0
    assert [t.meta.outcome_kind for t in solved + failed] == [OK, OK]
    assert [t.meta.outcome_kind for t in gave_up] == [POLICY]
    # no call answered: one row without tokens, the infrastructure's
    assert [(t.meta.outcome_kind, t.num_tokens) for t in engine_down] == [(INFRA, 0)]

    bucket = LocalBucket(tmp_path / "bucket")
    manifest = Sealer(bucket, "j", spool=tmp_path / "spool").seal(judged_down + solved + failed + gave_up + engine_down)
    assert manifest.outcome_kinds == {OK: 2, POLICY: 1, INFRA: 2}
    assert outcome_counts(manifest) == OutcomeCounts(ok=2, policy=1, infrastructure=2)

    batch = BatchReader(bucket, "j").read(0)
    assert batch.table.column("outcome_kind").to_pylist() == ["infrastructure", "ok", "ok", "policy", "infrastructure"]
    # what a trainer reads: the infrastructure's rows out of the rows, the statistics and the loss
    kept = batch.training_table()
    assert kept.column("session_id").to_pylist() == ["j-s1", "j-s2", "j-s3"]
    without = group_advantages([1.0, 0.0, 0.0], ["j/t"] * 3, ["j-s1", "j-s2", "j-s3"])
    assert without.tolist() == pytest.approx([1.4142, -0.7071, -0.7071], abs=1e-3)
    # every per-row view covers every row, in the table's order: the infrastructure's are not trained (advantage 0)
    aligned = [0.0, *without.tolist(), 0.0]
    assert batch.advantages().tolist() == pytest.approx(aligned)
    t = batch.tensors()
    assert t["trained"].tolist() == [False, True, True, True, False]
    assert t["sequence_advantages"].tolist() == pytest.approx(aligned) and not t["loss_mask"][0].any()
    # asked for, they are there (reward 0), and move the group's baseline
    everything = batch.training_table(include_infrastructure=True)
    assert everything.num_rows == 5
    assert batch.advantages(include_infrastructure=True)[1] != pytest.approx(without[0])
    assert batch.tensors(include_infrastructure=True)["trained"].all()


def test_a_group_left_with_one_valid_sample_trains_nothing(tmp_path: Path) -> None:
    rows = _session(tmp_path, 0, 0.0, evaluator="unavailable") + _session(tmp_path, 1, 1.0)
    bucket = LocalBucket(tmp_path / "bucket")
    Sealer(bucket, "j", spool=tmp_path / "spool").seal(rows)
    batch = BatchReader(bucket, "j").read(0)
    assert batch.training_table().column("session_id").to_pylist() == ["j-s1"]
    assert batch.advantages().tolist() == [0.0, 0.0]
    assert float(batch.tensors()["advantages"].abs().sum()) == 0.0  # nothing moves the loss


def test_outcome_counts_travel_as_the_operator_records_them() -> None:
    counts = OutcomeCounts(ok=3, policy=1, infrastructure=2)
    assert OutcomeCounts.from_json(counts.to_json()) == counts
    assert counts.to_json() == {"ok": 3, "policy": 1, "infrastructure": 2}
    assert OutcomeCounts.from_json(None) + counts == counts
