"""A sealed batch as the operator records it: on its sealer Job (the `tracefleet.io/batch` annotation, read
back by every later reconcile, after restarts too) and in the trainer webhook's `batch.sealed` delivery
(`BatchSealed`, the POST body). camelCase on the wire; a record written by an older operator still reads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class SealedBatch(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    seq: int  # the bucket's batch seq (what the Sealer claimed)
    batch_id: str | None = None
    uri: str
    traces: int = 0
    tokens: int = 0
    mean_reward: float | None = None
    sessions: int = 0
    # what the job's diagnostics made of its sessions (tracefleet.contract.semantics.DiagnosticsCounts.to_json)
    diagnostics: dict[str, Any] | None = None
    # its sessions by outcome kind (tracefleet.contract.semantics.OutcomeCounts.to_json)
    outcomes: dict[str, int] | None = None
    job_seq: int | None = None  # the sealer Job's seq (tracefleet.contract.layout.batch_id_for)
    sealed_at: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


BATCH_SEALED = "batch.sealed"


class JobRef(BaseModel):
    namespace: str
    name: str
    uid: str


class BatchSealed(BaseModel):
    """The body of the trainer webhook's POST for one sealed batch (HMAC-signed, tracefleet.operator.webhook)."""

    event: Literal["batch.sealed"] = BATCH_SEALED
    job: JobRef
    batch: SealedBatch

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
