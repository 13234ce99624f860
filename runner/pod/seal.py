"""The sealer Job's program: seal whole groups of finished sessions as one batch.

`python -m tracefleet.runner.pod seal`. The operator names the sessions (with their tasks and samples,
tracefleet.contract.semantics.encode_sessions) and the batch's job seq; each session's rows are built from
what its pods uploaded (capture log, the harness's result.json, the evaluator's reward.json) with the
same function local mode uses (tracefleet.runner.tracing.session_traces), failed sessions fail-closed,
and sealed with batch_id k8s-<seq>: a rerun of the Job finds the same batch instead of sealing twice.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from tracefleet.contract import layout, podenv
from tracefleet.contract.semantics import PlannedSession
from tracefleet.bucket import Bucket, ObjectNotFound
from tracefleet.contract.podenv import PodEnvError
from tracefleet.diagnostics.evidence import SessionEvidence, stored_evidence
from tracefleet.contract.layout import batch_id_for
from tracefleet.runner.pod.evidence import download_capture, uploaded_evidence
from tracefleet.runner.tracing import SessionOutcome, session_traces


def _json_object(bucket: Bucket, key: str) -> dict[str, Any] | None:
    try:
        return json.loads(bucket.get(key))
    except ObjectNotFound:
        return None


def session_outcome(bucket: Bucket, job: str, planned: PlannedSession) -> SessionOutcome:
    """What the pods left about one session: the harness's result.json (status, stage) and the evaluator's
    reward.json. Without a result.json, a session that was judged had a harness pod that succeeded (the
    operator judges no other); one that was not judged did not complete (fail-closed)."""
    reward = _json_object(bucket, layout.reward_key(job, planned.index))
    harness = (_json_object(bucket, layout.artifacts_prefix(job, planned.index) + layout.RESULT)
               or {"status": "completed" if reward else "error"})
    r = reward or {"status": "missing"}
    status = r.get("status") if r.get("status") in ("ok", "error", "timeout", "missing") else "error"
    return SessionOutcome(
        job=job, session_id=f"{job}-s{planned.index}", task_id=planned.task_id, group_id=planned.group_id,
        sample_index=planned.sample_index, status=harness.get("status") or "error", stage=harness.get("stage"),
        reward=r.get("reward"), evaluator_status=status, harness=harness.get("harness"), model=harness.get("model"),
        extra={"session_status": harness.get("status"), "session_stage": harness.get("stage"),
               "session_error": harness.get("error"), "harness_exit_code": harness.get("harness_exit_code")},
    )

def session_evidence_of(bucket: Bucket, job: str, planned: PlannedSession, capture: Path | None, tmp: Path) -> SessionEvidence:
    """The evidence the evaluator Job wrote, or (a session that was never judged) the same builder over
    the harness pod's uploads, without the task's test names (only its id is known here)."""
    stored = stored_evidence(bucket, job, f"{job}-s{planned.index}")
    if stored is not None:
        return stored.model_copy(update={"group_id": planned.group_id})
    artifacts = tmp / f"artifacts-{planned.index}"
    artifacts.mkdir()
    prefix = layout.artifacts_prefix(job, planned.index)
    for name in (layout.PATCH, layout.RESULT, layout.HARNESS_STDERR):
        try:
            (artifacts / name).write_bytes(bucket.get(prefix + name))
        except ObjectNotFound:
            pass
    return uploaded_evidence(job=job, session_id=f"{job}-s{planned.index}", task={"id": planned.task_id},
                             group_id=planned.group_id, sample_index=planned.sample_index, artifacts=artifacts,
                             capture=capture, evaluation=_json_object(bucket, layout.reward_key(job, planned.index)))


def seal(bucket: Bucket, job: str, seq: int, sessions: list[PlannedSession], builder: str = "prefix-merge",
         diagnostics: list[Any] | None = None, policy_version: int | None = None) -> dict[str, Any]:
    """Seal `sessions` (whole groups) as batch k8s-<seq>: every session gives its rows, failed ones
    fail-closed (tracefleet.contract.semantics), each judged by the job's diagnostics (`spec.diagnostics`;
    None: every built-in, flag only) over its evidence, as in local mode."""
    from tracefleet.diagnostics.registry import configured, run_diagnostics, unavailable
    from tracefleet.traces.seal import Sealer

    try:
        resolved = configured(diagnostics)
    except (ImportError, AttributeError, ValueError) as exc:  # a hook the image cannot import: the manifest's problem
        raise PodEnvError(f"{podenv.DIAGNOSTICS_JSON}: {type(exc).__name__}: {exc}") from None
    traces: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        for planned in sessions:
            path = download_capture(bucket, job, planned.index, Path(tmp) / f"{job}-s{planned.index}.jsonl")
            try:
                evidence = session_evidence_of(bucket, job, planned, path, Path(tmp)).model_copy(update={"policy_version": policy_version})
            except Exception as exc:  # noqa: BLE001 - the session is still sealed; the diagnostics say they could not judge
                findings = unavailable(f"evidence: {type(exc).__name__}: {exc}", resolved)
            else:
                findings = run_diagnostics(evidence, resolved=resolved)
            # no capture: the session's row says so (fail closed)
            traces += session_traces(path, session_outcome(bucket, job, planned), builder, findings).traces
        manifest = Sealer(bucket, job, spool=tmp).seal(traces, batch_id=batch_id_for(seq))
    return manifest.model_dump(mode="json")
