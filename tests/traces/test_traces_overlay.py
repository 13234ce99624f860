"""Overlays as a trainer reads them (tracefleet.traces.overlay): a diagnostic's verdicts written beside a
sealed batch change what BatchReader trains on exactly like a quarantine sealed in, the sealed batch is
never rewritten, the newest overlay of a diagnostic wins, several diagnostics add up, an overlay is read
when a batch is read, and each overlay object is fetched once per reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracefleet.bucket import LocalBucket
from tracefleet.contract.layout import OVERLAYS_DIR
from tracefleet.traces import BatchReader, Sealer, SessionInfo, build_traces, group_advantages
from tracefleet.traces.overlay import Overlay, write_overlay
from tracefleet.traces.synthetic import SyntheticSession

JOB = "job"
REWARDS = {"s0": 1.0, "s1": 1.0, "s2": 0.0, "s3": 0.0, "s4": 1.0, "s5": 0.0}


class CountingBucket(LocalBucket):
    """A directory bucket that counts the overlay objects it is asked for."""

    overlay_gets = 0

    def get(self, key: str) -> bytes:
        if f"/{OVERLAYS_DIR}/" in key:
            self.overlay_gets += 1
        return super().get(key)


@pytest.fixture
def bucket(tmp_path: Path) -> CountingBucket:
    """One sealed batch: six sessions of one group; s0 was quarantined at sealing (reward forced to 0)."""
    traces = []
    for i, (sid, reward) in enumerate(REWARDS.items()):
        s = SyntheticSession(tmp_path / f"{sid}.jsonl", sid, seed=i)
        s.call(s.tokens(20), 4)
        s.close()
        built = build_traces(tmp_path / f"{sid}.jsonl", session=SessionInfo(job=JOB, session_id=sid, group_id="g", reward=reward)).traces
        if sid == "s0":
            for t in built:
                t.meta.quarantined, t.meta.reward = True, 0.0
                t.meta.diagnostics = [{"name": "sealed_in", "version": "1", "severity": "error", "message": "m",
                                       "action": "quarantine", "file": "a.py", "line": 1}]
        traces += built
    b = CountingBucket(tmp_path / "bucket")
    Sealer(b, JOB, spool=tmp_path / "spool").seal(traces, batch_id="b1")
    return b


def finding(name: str, action: str = "quarantine") -> dict[str, object]:
    return {"name": name, "version": "2", "severity": "error", "message": f"{name} says no", "action": action,
            "file": "calc.py", "line": 3, "call_id": None}


def overlay(name: str, sessions: list[str], action: str = "quarantine") -> Overlay:
    return Overlay(job=JOB, diagnostic=name, version="2", action=action, seqs=[0], judged=6,  # type: ignore[arg-type]
                   sessions={s: [finding(name, action)] for s in sessions})


def trained(reader: BatchReader) -> dict[str, float]:
    batch = reader.read(0)
    return {s: a for s, a, k in zip(batch.table.column("session_id").to_pylist(), batch.advantages().tolist(),
                                   batch.trained(), strict=True) if k}


def expected(leave_out: set[str]) -> dict[str, float]:
    kept = [s for s in REWARDS if s not in leave_out]
    return dict(zip(kept, group_advantages([REWARDS[s] for s in kept], ["g"] * len(kept), kept).tolist(), strict=True))


def test_an_overlay_quarantines_like_sealing_without_rewriting_the_batch(bucket: CountingBucket) -> None:
    sealed = {o.key: bucket.get(o.key) for o in bucket.list(f"{JOB}/batches/")}
    assert trained(BatchReader(bucket, JOB)) == pytest.approx(expected({"s0"}))
    write_overlay(bucket, overlay("hardcoded", ["s1", "s2"]))
    reader = BatchReader(bucket, JOB)
    assert trained(reader) == pytest.approx(expected({"s0", "s1", "s2"}))
    batch = reader.read(0)
    assert [o.diagnostic for o in batch.overlays] == ["hardcoded"]
    assert batch.findings() == {"s0": [{**finding("sealed_in"), "version": "1", "message": "m", "file": "a.py", "line": 1}],
                                "s1": [finding("hardcoded")], "s2": [finding("hardcoded")]}
    everything = batch.training_table(include_quarantined=True).select(["session_id", "quarantined", "reward"]).to_pylist()
    assert [(r["session_id"], r["quarantined"], r["reward"]) for r in everything] == [
        ("s0", True, 0.0), ("s1", True, 0.0), ("s2", True, 0.0), ("s3", False, 0.0), ("s4", False, 1.0), ("s5", False, 0.0)]
    assert [(t.meta.session_id, t.meta.quarantined, t.meta.reward) for t in batch.traces()][:3] == [
        ("s0", True, 0.0), ("s1", True, 0.0), ("s2", True, 0.0)]
    tensors = batch.tensors()
    assert tensors["trained"].tolist() == [False] * 3 + [True] * 3 and not tensors["loss_mask"][:3].any()
    # the sealed data alone, on request; the batch's objects are byte for byte what was sealed
    assert trained(BatchReader(bucket, JOB, overlays=False)) == pytest.approx(expected({"s0"}))
    assert {o.key: bucket.get(o.key) for o in bucket.list(f"{JOB}/batches/")} == sealed


def test_several_diagnostics_add_up_and_the_newest_overlay_of_one_replaces_the_older(bucket: CountingBucket) -> None:
    write_overlay(bucket, overlay("hardcoded", ["s1"]))
    write_overlay(bucket, overlay("tests_edited", ["s4"]))
    reader = BatchReader(bucket, JOB)
    assert set(trained(reader)) == {"s2", "s3", "s5"}
    write_overlay(bucket, overlay("hardcoded", ["s1"], action="flag"))  # re-run, findings only
    assert set(trained(reader)) == {"s1", "s2", "s3", "s5"}
    assert reader.read(0).findings()["s1"] == [finding("hardcoded", "flag")]
    write_overlay(bucket, overlay("tests_edited", []))  # flags nothing: withdraws its verdicts
    assert set(trained(reader)) == {"s1", "s2", "s3", "s4", "s5"}
    # an overlay only adds: the quarantine sealed in stays
    assert "s0" not in trained(reader)


def test_a_batch_read_before_an_overlay_keeps_what_was_read(bucket: CountingBucket) -> None:
    reader = BatchReader(bucket, JOB, consumer="trainer-0")
    (before,) = list(reader.follow(idle_exit=True))
    write_overlay(bucket, overlay("hardcoded", ["s1"]))
    assert "s1" in before.training_table().column("session_id").to_pylist()  # already in the trainer's hands
    assert "s1" not in reader.read(0).training_table().column("session_id").to_pylist()  # read again: applied


def test_each_overlay_object_is_fetched_once_per_reader(bucket: CountingBucket) -> None:
    write_overlay(bucket, overlay("hardcoded", ["s1"]))
    write_overlay(bucket, overlay("tests_edited", ["s4"]))
    reader = BatchReader(bucket, JOB)
    for _ in range(5):
        reader.read(0)
    assert bucket.overlay_gets == 2
    write_overlay(bucket, overlay("hardcoded", ["s2"]))
    reader.read(0)
    assert bucket.overlay_gets == 3
    BatchReader(bucket, JOB, overlays=False).read(0)
    assert bucket.overlay_gets == 3
