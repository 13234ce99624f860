"""The sealing policy (operator/sealing.py): what the sealer Jobs say, and which finished sessions make
the next batches (whole groups, tracesPerBatch, the remainder at the end)."""

from __future__ import annotations

import json

from fixtures.rolloutjobs import small_job
from tracefleet.contract.job import RolloutJob
from tracefleet.contract.sealed_batch import BatchSealed, JobRef, SealedBatch
from tracefleet.operator import names as n
from tracefleet.operator.sealing import (
    ANNOTATION_BATCH,
    MAX_READS_PER_RECONCILE,
    batches_to_seal,
    observe_sealers,
    record_annotation,
    recorded_batch,
)


def sealer(seq: int, sessions: str, condition: str | None = None, batch: SealedBatch | None = None) -> dict:
    ann = {n.ANNOTATION_SESSIONS: sessions, **(record_annotation(batch) if batch else {})}
    return {"metadata": {"name": f"j-seal-{seq:06d}", "labels": {n.LABEL_BATCH: str(seq)}, "annotations": ann},
            "status": {"conditions": [{"type": condition, "status": "True"}] if condition else []}}


def test_what_the_sealer_jobs_say() -> None:
    b0 = SealedBatch(seq=4, batch_id="k8s-000000", uri="s3://b/j/batches/000004/", traces=2, job_seq=0)
    seen = observe_sealers([sealer(2, "4-5", "Complete"), sealer(0, "0-1", "Complete", b0), sealer(1, "2-3", "Failed"),
                            sealer(3, "6-7")])
    assert seen.count == 4 and seen.next_seq == 4
    assert seen.assigned == set(range(8))
    assert seen.recorded == [b0]
    assert seen.completed == [(2, "j-seal-000002")]  # done, batch to read and record
    assert seen.failed == "sealer Job j-seal-000001 failed"
    many = observe_sealers([sealer(s, str(s), "Complete") for s in range(MAX_READS_PER_RECONCILE + 3)])
    assert [seq for seq, _ in many.completed] == list(range(MAX_READS_PER_RECONCILE))  # bounded reads per pass
    assert observe_sealers([]).next_seq == 0


def test_a_recorded_batch_reads_back_and_an_older_record_still_reads() -> None:
    batch = SealedBatch(seq=7, batch_id="k8s-000003", uri="s3://b/j/batches/000007/", traces=4, tokens=900, mean_reward=0.5,
                        sessions=4, diagnostics={"judged": 4}, outcomes={"ok": 3, "policy": 0, "infrastructure": 1},
                        job_seq=3, sealed_at="2026-01-01T00:00:00Z")
    ann = record_annotation(batch)[ANNOTATION_BATCH]
    assert json.loads(ann) == {"seq": 7, "batchId": "k8s-000003", "uri": "s3://b/j/batches/000007/", "traces": 4,
                               "tokens": 900, "meanReward": 0.5, "sessions": 4, "diagnostics": {"judged": 4},
                               "outcomes": {"ok": 3, "policy": 0, "infrastructure": 1}, "jobSeq": 3,
                               "sealedAt": "2026-01-01T00:00:00Z"}
    assert recorded_batch(sealer(3, "0-3", "Complete", batch)) == batch
    # the trainer webhook's body carries the same record
    hook = BatchSealed(job=JobRef(namespace="team", name="j", uid="u-1"), batch=batch).to_wire()
    assert hook == {"event": "batch.sealed", "job": {"namespace": "team", "name": "j", "uid": "u-1"}, "batch": json.loads(ann)}
    old = sealer(0, "0-1", "Complete")
    old["metadata"]["annotations"][ANNOTATION_BATCH] = json.dumps({"seq": 0, "uri": "s3://b/j/batches/000000/", "traces": 2})
    assert recorded_batch(old) == SealedBatch(seq=0, uri="s3://b/j/batches/000000/", traces=2)
    assert recorded_batch(sealer(1, "2")) is None


def job(traces_per_batch: int, samples: int) -> RolloutJob:
    return small_job(tasks=5, samples=samples, output={"uri": "s3://traces/runs", "tracesPerBatch": traces_per_batch})


def test_batches_are_whole_groups_of_finished_sessions() -> None:
    tasks = [f"t{i}" for i in range(5)]
    j = job(traces_per_batch=4, samples=2)  # two groups of two sessions per batch
    # group 0 and 2 finished, group 1 half: one batch of groups 0 and 2 (in task order)
    (batch,) = batches_to_seal(j, tasks, {0, 1, 2, 4, 5}, set())
    assert [p.index for p in batch] == [0, 1, 4, 5] and {p.task_id for p in batch} == {"t0", "t2"}
    # the same sessions once assigned to a sealer Job are never batched again
    assert batches_to_seal(j, tasks, {0, 1, 2, 4, 5}, {0, 1, 4, 5}) == []
    # one whole group left waits for a second one, until every session finished
    assert batches_to_seal(j, tasks, set(range(8)), set(range(6))) == []
    (last,) = batches_to_seal(j, tasks, set(range(10)), set(range(8)))
    assert [p.index for p in last] == [8, 9] and last[0].group_id == "j/t4"
