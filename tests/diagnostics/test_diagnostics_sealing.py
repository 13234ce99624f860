"""Findings on sealed rows, what a trainer sees: session_traces (both drivers) labels every row with the
session's findings; a quarantined session's reward is forced to <= 0 and BatchReader leaves it out of
tensors()/advantages() and out of the group statistics unless include_quarantined=True; a dropped
session keeps one row without tokens; the manifest counts findings per diagnostic."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracefleet.contract.semantics import DROPPED_BY_DIAGNOSTICS
from tracefleet.bucket import LocalBucket
from tracefleet.diagnostics.base import Finding, SessionFindings
from tracefleet.runner.tracing import SessionOutcome, session_traces
from tracefleet.traces.reader import BatchReader
from tracefleet.traces.seal import Sealer
from tracefleet.traces.synthetic import SyntheticSession


def _finding(action: str) -> Finding:
    return Finding(name="protected_files", version="1", severity="error", message="test file test_calc.py edited",
                   file="test_calc.py", line=4, action=action)  # type: ignore[arg-type]


def _rows(tmp_path: Path, sample: int, reward: float, findings: SessionFindings | None) -> list:
    path = tmp_path / f"j-s{sample}.jsonl"
    with SyntheticSession(path, f"j-s{sample}", seed=sample) as sess:
        sess.call(sess.tokens(30), n_completion=8)
    outcome = SessionOutcome(job="j", session_id=f"j-s{sample}", task_id="t", group_id="j/t", sample_index=sample,
                             reward=reward, evaluator_status="ok")
    return session_traces(path, outcome, findings=findings).traces


def test_quarantined_sessions_are_sealed_labelled_and_left_out_of_training(tmp_path: Path) -> None:
    hack = _rows(tmp_path, 0, 1.0, SessionFindings(findings=[_finding("quarantine")]))
    flagged = _rows(tmp_path, 1, 1.0, SessionFindings(findings=[_finding("flag")]))
    clean = _rows(tmp_path, 2, 0.0, SessionFindings())
    assert hack[0].meta.quarantined and hack[0].meta.reward == 0.0 and hack[0].meta.evaluator_reward == 1.0
    assert not flagged[0].meta.quarantined and flagged[0].meta.reward == 1.0  # flag: recorded only
    bucket = LocalBucket(tmp_path / "bucket")
    manifest = Sealer(bucket, "j", spool=tmp_path / "spool").seal(hack + flagged + clean)
    assert manifest.quarantined_sessions == 1
    stats = manifest.diagnostics["protected_files"]
    assert (stats.findings, stats.sessions, stats.quarantined, stats.dropped) == (2, 2, 1, 0)

    batch = BatchReader(bucket, "j").read(0)
    assert batch.table.column("quarantined").to_pylist() == [True, False, False]  # nothing lost
    (finding,) = batch.table.column("diagnostics").to_pylist()[0]
    assert (finding["name"], finding["version"], finding["severity"], finding["file"], finding["line"]) == (
        "protected_files", "1", "error", "test_calc.py", 4)
    # The group's statistics come from the valid sessions only: flagged 1.0 vs clean 0.0.
    assert batch.training_table().column("session_id").to_pylist() == ["j-s1", "j-s2"]
    assert batch.advantages().tolist() == pytest.approx([0.0, 1.0, -1.0], abs=1e-4)  # one per row, in order
    assert batch.tensors()["trained"].tolist() == [False, True, True]
    # Asked for, the hack is a negative example: its reward is 0, so it is demoted, not promoted.
    assert batch.advantages(include_quarantined=True).tolist() == pytest.approx([-0.7071, 1.4142, -0.7071], abs=1e-3)
    assert batch.tensors(include_quarantined=True)["trained"].all()


def test_a_dropped_session_leaves_one_row_without_tokens(tmp_path: Path) -> None:
    (row,) = _rows(tmp_path, 0, 1.0, SessionFindings(findings=[_finding("drop")]))
    assert row.num_tokens == 0 and row.meta.quarantined and row.meta.reward == 0.0
    assert row.meta.fail_closed_reasons[-1] == DROPPED_BY_DIAGNOSTICS and row.meta.diagnostics[0]["action"] == "drop"
    bucket = LocalBucket(tmp_path / "bucket")
    manifest = Sealer(bucket, "j", spool=tmp_path / "spool").seal([row, *_rows(tmp_path, 1, 0.0, SessionFindings())])
    assert manifest.diagnostics["protected_files"].dropped == 1 and manifest.sessions == 2
