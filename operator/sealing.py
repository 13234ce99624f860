"""Sealing: which finished sessions go into which batch, and what the sealer Jobs say (pure).

A batch holds whole groups (tracefleet.contract.semantics): a sealer Job is created for `groups_per_batch`
groups whose sessions have all finished, failed ones included (they are sealed fail-closed). The
assignment is written on the Job itself (its sessions annotation; Jobs are immutable), so a restarted
operator never seals a session twice; once the Job completed and its manifest is in the bucket, the
batch is recorded on the Job too (ANNOTATION_BATCH) and counted from there."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tracefleet.contract.job import RolloutJob
from tracefleet.contract.semantics import SessionSlot, groups_per_batch, next_batches, session_slots
from tracefleet.contract.sealed_batch import SealedBatch
from tracefleet.operator import names as n
from tracefleet.operator.session_table import job_condition

ANNOTATION_BATCH = "tracefleet.io/batch"  # on a sealer Job: its batch, recorded (SealedBatch)
# Manifest reads one reconcile makes for sealer Jobs that completed since the last
MAX_READS_PER_RECONCILE = 5


def sealer_seq(sealer: dict[str, Any]) -> int:
    return int((sealer["metadata"].get("labels") or {}).get(n.LABEL_BATCH, "0"))


def recorded_batch(sealer: dict[str, Any]) -> SealedBatch | None:
    ann = (sealer["metadata"].get("annotations") or {}).get(ANNOTATION_BATCH)
    return None if ann is None else SealedBatch.model_validate_json(ann)


def record_annotation(batch: SealedBatch) -> dict[str, str]:
    return {ANNOTATION_BATCH: json.dumps(batch.to_wire(), sort_keys=True)}


@dataclass
class Sealers:
    """What the job's sealer Jobs say."""

    count: int = 0
    next_seq: int = 0  # the next sealer Job's seq
    assigned: set[int] = field(default_factory=set)  # sessions some sealer Job seals
    recorded: list[SealedBatch] = field(default_factory=list)
    completed: list[tuple[int, str]] = field(default_factory=list)  # (seq, Job name): done, batch not recorded yet
    failed: str = ""  # which sealer Job failed


def observe_sealers(sealers: list[dict[str, Any]]) -> Sealers:
    out = Sealers(count=len(sealers))
    for sj in sorted(sealers, key=sealer_seq):
        seq = sealer_seq(sj)
        out.next_seq = max(out.next_seq, seq + 1)
        out.assigned.update(n.decode_ranges((sj["metadata"].get("annotations") or {}).get(n.ANNOTATION_SESSIONS, "")))
        if (batch := recorded_batch(sj)) is not None:
            out.recorded.append(batch)
        elif job_condition(sj, "Failed"):
            out.failed = f"sealer Job {sj['metadata']['name']} failed"
        elif job_condition(sj, "Complete") and len(out.completed) < MAX_READS_PER_RECONCILE:
            out.completed.append((seq, sj["metadata"]["name"]))
    return out


def batches_to_seal(job: RolloutJob, task_ids: list[str], finished: set[int], assigned: set[int]) -> list[list[SessionSlot]]:
    """The sessions of each new batch: whole groups whose sessions all finished and none is assigned, in
    task order; the last, smaller batch once every session finished."""
    samples = job.spec.tasks.samples_per_task
    slots = session_slots(job.name, task_ids, samples)
    groups = [slots[t * samples : (t + 1) * samples] for t in range(len(task_ids))]
    ready = [t for t, g in enumerate(groups) if all(p.index in finished and p.index not in assigned for p in g)]
    per_batch = groups_per_batch(job.spec.output.traces_per_batch, samples)
    return [[p for t in batch for p in groups[t]] for batch in next_batches(ready, per_batch, final=len(finished) == len(slots))]
