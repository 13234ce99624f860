"""A sealed batch's `manifest.json`: what the sealers (`tracefleet run`, the sealer Job) write last and the
operator, `BatchReader` and the trainer notification read (layout: tracefleet.contract.layout)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from tracefleet.contract.semantics import OutcomeKind

BATCH_FORMAT_VERSION = 1
TRACE_SCHEMA_VERSION = 1  # the Parquet rows' schema (tracefleet.traces.schema)


class ObjectEntry(BaseModel):
    name: str  # relative to the batch folder
    size: int
    sha256: str
    rows: int


class RewardStats(BaseModel):
    count: int = 0  # traces with a reward
    sessions: int = 0
    mean: float | None = None  # over sessions (one reward per session)
    std: float | None = None
    min: float | None = None
    max: float | None = None
    positive: int = 0  # sessions with reward > 0
    fail_closed: int = 0  # sessions marked fail_closed


class DiagnosticStats(BaseModel):
    """One diagnostic's findings in a batch."""

    findings: int = 0
    sessions: int = 0  # sessions with at least one finding of it
    quarantined: int = 0  # of those, sessions quarantined (by any finding)
    dropped: int = 0  # of those, sessions whose token rows were dropped


class BatchManifest(BaseModel):
    """`manifest.json`: written last, with a conditional create. A batch exists iff its manifest does."""

    format_version: int = BATCH_FORMAT_VERSION
    schema_version: int = TRACE_SCHEMA_VERSION
    job: str
    seq: int = -1
    batch_id: str
    created_at: float = 0.0
    sealer: str = ""
    traces: int = 0
    sessions: int = 0
    groups: int = 0
    tokens: int = 0
    trainable_tokens: int = 0
    builders: dict[str, int] = Field(default_factory=dict)
    reward: RewardStats = Field(default_factory=RewardStats)
    quarantined_sessions: int = 0  # a diagnostic quarantined or dropped them (left out of training)
    dropped_sessions: int = 0  # of those, sessions whose token rows were not sealed
    diagnostics: dict[str, DiagnosticStats] = Field(default_factory=dict)  # by diagnostic name
    # sessions by whose outcome they are (tracefleet.contract.semantics.OutcomeKind); `infrastructure` ones are
    # left out of training. Empty in batches sealed before outcome kinds.
    outcome_kinds: dict[OutcomeKind, int] = Field(default_factory=dict)
    objects: list[ObjectEntry] = Field(default_factory=list)


class ManifestPack(BaseModel):
    """`<job>/manifest-packs/<first:06d>.json` (layout.manifest_pack_key): the manifests of MANIFEST_PACK_SIZE sealed
    batches in a row, from `first`, as they were sealed; written once, by the sealer of the last of them. A reader of
    every manifest (the dashboard's first view) reads one object for a hundred batches: on S3 each GET is a round
    trip and about a millisecond of the client's CPU. A batch's own manifest stays what makes it exist."""

    job: str
    first: int
    manifests: list[BatchManifest] = Field(default_factory=list)
