"""Every key of a job's bucket: where each process writes and each reader looks (pure; no I/O).

Keys are relative to the bucket URI (`s3://bucket/prefix` or a directory); `*_uri` functions prefix
them with it. Stable: trainers and reruns rely on it.

    <job>/batches/<seq:06d>/traces-<batch_id>.parquet  a sealed batch's data (written first)
    <job>/batches/<seq:06d>/manifest.json              written last, conditional create: a batch
                                                       exists iff its manifest does
    <job>/consumers/<consumer>.json                    a trainer's cursor {"next_seq": N}
    <job>/sessions/<session>/capture.jsonl             on Kubernetes, per session: the proxy sidecar's
    <job>/sessions/<session>/bodies/<call>.json          upload when its pod stops (capture log,
    <job>/sessions/<session>/artifacts/<path>            oversized request bodies, the harness's
    <job>/sessions/<session>/upload.json                 artifacts; upload.json written last)
    <job>/sessions/<session>/reward.json               the evaluator Job's verdict
    <job>/evidence/<session id>.json                   a session's evidence (tracefleet.diagnostics)
    <job>/progress.json                                the job's live progress, overwritten as it goes
                                                       (tracefleet.contract.progress.JobProgress)
    <job>/overlays/<diagnostic>/<stamp>.json           `tracefleet diagnose --write-overlay`: a diagnostic's
                                                       verdicts on sealed sessions, applied by the reader

The harness's artifacts (`artifacts/<name>`, and the same names in a local session folder) are named
below too: the harness entrypoint writes them, the sidecar waits for RESULT, the evaluator reads them.
"""

from __future__ import annotations

import re

BATCHES = "batches"
CONSUMERS = "consumers"
SESSIONS = "sessions"
MANIFEST = "manifest.json"

# A session folder's objects (relative to the session prefix: where the sidecar uploads, SidecarPlan.upload_to).
CAPTURE_LOG = "capture.jsonl"
BODIES = "bodies/"
ARTIFACTS = "artifacts/"
UPLOAD_MANIFEST = "upload.json"
REWARD = "reward.json"
# A run of the session that was stopped (its pod deleted: suspend, eviction, `kubectl delete`) uploads under
# STOPPED/<milliseconds since the epoch>/ instead: the session runs again (semantics: a stopped session is neither
# failed nor retried, it is run again), and the run that seals must not overwrite the calls the stopped one captured.
STOPPED = "stopped/"

# The harness's artifacts.
PATCH = "session.patch"  # git diff of the workspace against the task's base commit
RESULT = "result.json"  # the harness entrypoint's SessionResult, written last
HARNESS_STDOUT = "harness.stdout"
HARNESS_STDERR = "harness.stderr"
SETUP_LOG = "setup.log"
EXIT_CODE = "exit_code"

# A session's folder (tracefleet.runner.workspace): the task as prepared, committed as the base, and the harness's
# copy, which a pod mounts at spec.harness.workspace.workdir (a subPath of the session's volume).
ORIGINAL = "original"
WORKDIR = "workdir"

_SEQ = re.compile(r"^(\d{6,})$")


def job_root(job: str) -> str:
    """The job's folder (its name, checked: one path segment)."""
    if not job or "/" in job or job in (".", ".."):
        raise ValueError(f"invalid job name {job!r}")
    return job


def batches_prefix(job: str) -> str:
    return f"{job_root(job)}/{BATCHES}/"


def batch_dir(job: str, seq: int) -> str:
    return f"{batches_prefix(job)}{seq:06d}"


def batch_id_for(job_seq: int) -> str:
    """The batch_id a sealer Job seals with (k8s-<the operator's seq>): a rerun of the Job finds the batch
    it already sealed instead of sealing twice, and the operator finds the batch by it."""
    return f"k8s-{job_seq:06d}"


def batch_object_key(job: str, seq: int, name: str) -> str:
    return f"{batch_dir(job, seq)}/{name}"


def manifest_key(job: str, seq: int) -> str:
    return batch_object_key(job, seq, MANIFEST)


def data_object_name(batch_id: str) -> str:
    """A batch's data object: named by its batch_id, so sealers racing for one seq never overwrite
    each other's data."""
    return f"traces-{batch_id}.parquet"


def batch_key_parts(job: str, key: str) -> tuple[int, str] | None:
    """(seq, object name) of a key under the job's batches, or None for any other key. A key may carry
    the bucket's own prefix in front (a listing of a prefixed bucket)."""
    root = batches_prefix(job)
    rest = key[len(root):] if key.startswith(root) else key.split(f"/{BATCHES}/", 1)[-1]
    seq_part, _, name = rest.partition("/")
    return (int(seq_part), name) if _SEQ.match(seq_part) and name else None


def cursor_key(job: str, consumer: str) -> str:
    return f"{job_root(job)}/{CONSUMERS}/{consumer}.json"


def session_prefix(job: str, session: int) -> str:
    return f"{job_root(job)}/{SESSIONS}/{session}/"


def capture_key(job: str, session: int) -> str:
    return session_prefix(job, session) + CAPTURE_LOG


def reward_key(job: str, session: int) -> str:
    return session_prefix(job, session) + REWARD


def artifacts_prefix(job: str, session: int) -> str:
    return session_prefix(job, session) + ARTIFACTS


def session_uri(bucket_uri: str, job: str, session: int) -> str:
    """The session's folder as a URI, with the trailing slash: where the sidecar uploads (SidecarPlan.upload_to)."""
    return f"{bucket_uri.rstrip('/')}/{session_prefix(job, session)}"


def batch_uri(bucket_uri: str, job: str, seq: int) -> str:
    """A sealed batch's folder as a URI, with the trailing slash (RolloutJob status.recentBatches)."""
    return f"{bucket_uri.rstrip('/')}/{batch_dir(job, seq)}/"


# ---- live progress (tracefleet.contract.progress): the running count and ETA no sealed batch holds

PROGRESS = "progress.json"


def progress_key(job: str) -> str:
    return f"{job_root(job)}/{PROGRESS}"


# ---- session evidence (tracefleet.diagnostics): what the diagnostics read, kept beside the batches

EVIDENCE_DIR = "evidence"
EVIDENCE = "evidence.json"  # the same object in a local session's folder


def evidence_key(job: str, session_id: str) -> str:
    """One session's evidence (tracefleet.diagnostics.evidence.SessionEvidence JSON), by the session id its
    trace rows carry: local mode writes it when the session finishes, on Kubernetes the evaluator Job
    (it holds the patch, the task and the judging); the sealer and `tracefleet diagnose` read it."""
    return f"{job_root(job)}/{EVIDENCE_DIR}/{session_id}.json"


# ---- overlays (tracefleet.traces.overlay): a diagnostic's verdicts on sealed sessions, applied by the reader

OVERLAYS_DIR = "overlays"
_OVERLAY_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def overlays_prefix(job: str) -> str:
    return f"{job_root(job)}/{OVERLAYS_DIR}/"


def overlay_key(job: str, diagnostic: str, stamp: str) -> str:
    """One overlay, written once and never rewritten: `<job>/overlays/<diagnostic>/<stamp>.json`. `stamp`
    sorts by writing time, so the newest overlay of a diagnostic is the last key of its folder."""
    if not _OVERLAY_NAME.match(diagnostic) or diagnostic in (".", ".."):
        raise ValueError(f"diagnostic name {diagnostic!r} cannot name an overlay (letters, digits, . _ - only)")
    return f"{overlays_prefix(job)}{diagnostic}/{stamp}.json"


def overlay_key_parts(job: str, key: str) -> tuple[str, str] | None:
    """(diagnostic, stamp) of a key under the job's overlays, or None for any other key (a key may carry
    the bucket's own prefix in front)."""
    root = overlays_prefix(job)
    rest = key[len(root):] if key.startswith(root) else key.split(f"/{OVERLAYS_DIR}/", 1)[-1]
    diagnostic, _, name = rest.partition("/")
    if not _OVERLAY_NAME.match(diagnostic) or "/" in name or not name.endswith(".json"):
        return None
    return diagnostic, name[: -len(".json")]


# ---- re-judgings (tracefleet.traces.rejudge): new verdicts on sealed sessions the judge could not judge

REJUDGED_DIR = "rejudged"


def rejudged_prefix(job: str) -> str:
    return f"{job_root(job)}/{REJUDGED_DIR}/"


def rejudged_key(job: str, stamp: str) -> str:
    """One rerun's re-judgings, written once: `<job>/rejudged/<stamp>.json`; `stamp` sorts by writing time, so a
    session judged again by a later rerun is found in a later key."""
    return f"{rejudged_prefix(job)}{stamp}.json"


# ---- manifest packs (tracefleet.contract.batch.ManifestPack): a hundred sealed manifests in one object

PACKS_DIR = "manifest-packs"
MANIFEST_PACK_SIZE = 100
_PACK_NAME = re.compile(r"^(\d{6,})\.json$")


def packs_prefix(job: str) -> str:
    return f"{job_root(job)}/{PACKS_DIR}/"


def manifest_pack_key(job: str, first: int) -> str:
    """The pack of the manifests of batches `first` .. `first + MANIFEST_PACK_SIZE - 1` (`first` a multiple of it)."""
    if first % MANIFEST_PACK_SIZE:
        raise ValueError(f"a manifest pack starts at a multiple of {MANIFEST_PACK_SIZE}, not at {first}")
    return f"{packs_prefix(job)}{first:06d}.json"


def manifest_pack_first(key: str) -> int | None:
    """The first seq of a pack's key (the bucket's prefix in front or not), None for any other key."""
    match = _PACK_NAME.match(key.rsplit("/", 1)[-1])
    return int(match.group(1)) if match and f"/{PACKS_DIR}/" in f"/{key}" else None
