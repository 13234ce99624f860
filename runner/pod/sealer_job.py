"""The sealer Job's program: seal whole groups of finished sessions as one batch.

`python -m tracefleet.runner.pod seal`. The operator names the sessions (with their tasks and samples,
tracefleet.contract.semantics.encode_sessions) and the batch's job seq; each session's rows are built from
what its pods uploaded, read typed (tracefleet.runner.pod.evidence): the harness pod's result.json judged
with the evaluator Job's reward.json (`SessionResult.judged`), then the same functions local mode uses
(tracefleet.runner.tracing.outcome_of, session_traces): the same trace metadata from both drivers.
Failed sessions fail closed. Sealed with batch_id k8s-<seq>: a rerun of the Job finds the same batch
instead of sealing twice.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tracefleet.contract import layout, podenv
from tracefleet.contract.semantics import PlannedSession
from tracefleet.bucket import Bucket, ObjectNotFound
from tracefleet.contract.session import EvaluatorSpec, HarnessConfig, SessionPlan, SessionResult, Task, session_id
from tracefleet.diagnostics.evidence import SessionEvidence, stored_evidence
from tracefleet.contract.layout import batch_id_for
from tracefleet.contract.podenv import PodEnvError
from tracefleet.runner.pod.evidence import download_capture, missing_result, stored_verdict, uploaded_result
from tracefleet.runner.session import evidence_of
from tracefleet.runner.tracing import session_traces


def _plan(job: str, planned: PlannedSession) -> SessionPlan:
    """What the sealer knows of a session's plan: its ids (the task itself only by its id)."""
    return SessionPlan(session_id=session_id(job, planned.index), job=job, task=Task(id=planned.task_id, prompt=""),
                       sample_index=planned.sample_index, group_id=planned.group_id, harness=HarnessConfig(),
                       evaluator=EvaluatorSpec(type="none"), model="")


def session_result(bucket: Bucket, job: str, planned: PlannedSession, tmp: Path) -> SessionResult:
    """The session as its pods left it, judged: result.json with reward.json's verdict. A session that was
    judged had a harness pod that succeeded (the operator judges no other), so a lost result.json then
    reads as completed; one never judged and without a result.json did not complete (fail closed)."""
    plan = _plan(job, planned)
    verdict = stored_verdict(bucket, job, planned.index)
    result = uploaded_result(bucket, job, planned.index, plan, tmp / f"result-{planned.index}")
    if verdict is None:
        return result or missing_result(plan)
    return (result or SessionResult.for_plan(plan).model_copy(update={"harness": None, "model": None})).judged(verdict)


def session_evidence_of(bucket: Bucket, job: str, planned: PlannedSession, result: SessionResult, capture: Path | None,
                        tmp: Path) -> SessionEvidence:
    """The evidence the evaluator Job wrote, or (a session that was never judged) the same builder over
    the harness pod's uploads, without the task's test names (only its id is known here)."""
    stored = stored_evidence(bucket, job, result.session_id)
    if stored is not None:
        return stored.model_copy(update={"group_id": planned.group_id})
    artifacts = tmp / f"artifacts-{planned.index}"
    artifacts.mkdir()
    prefix = layout.artifacts_prefix(job, planned.index)
    for name in (layout.PATCH, layout.HARNESS_STDERR):
        try:
            (artifacts / name).write_bytes(bucket.get(prefix + name))
        except ObjectNotFound:
            pass
    patch = artifacts / layout.PATCH
    return evidence_of(result, task={"id": planned.task_id}, capture=capture,
                       patch=patch.read_text() if patch.exists() else "", stderr=artifacts / layout.HARNESS_STDERR,
                       policy_version=None)


def seal(bucket: Bucket, job: str, seq: int, sessions: list[PlannedSession], builder: str = "prefix-merge",
         diagnostics: list[Any] | None = None, policy_version: int | None = None) -> dict[str, Any]:
    """Seal `sessions` (whole groups) as batch k8s-<seq>: every session gives its rows, failed ones
    fail-closed (tracefleet.contract.semantics), each judged by the job's diagnostics (`spec.diagnostics`;
    None: every built-in, flag only) over its evidence, as in local mode."""
    from tracefleet.diagnostics.registry import configured, run_diagnostics, unavailable
    from tracefleet.runner.tracing import outcome_of
    from tracefleet.traces.seal import Sealer

    try:
        resolved = configured(diagnostics)
    except (ImportError, AttributeError, ValueError) as exc:  # a hook the image cannot import: the manifest's problem
        raise PodEnvError(f"{podenv.DIAGNOSTICS_JSON}: {type(exc).__name__}: {exc}") from None
    traces: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        for planned in sessions:
            result = session_result(bucket, job, planned, Path(tmp))
            path = download_capture(bucket, job, planned.index, Path(tmp) / f"{result.session_id}.jsonl")
            try:
                evidence = session_evidence_of(bucket, job, planned, result, path, Path(tmp)).model_copy(
                    update={"policy_version": policy_version})
            except Exception as exc:  # noqa: BLE001 - the session is still sealed; the diagnostics say they could not judge
                findings = unavailable(f"evidence: {type(exc).__name__}: {exc}", resolved)
            else:
                findings = run_diagnostics(evidence, resolved=resolved)
            # no capture: the session's row says so (fail closed)
            traces += session_traces(path, outcome_of(result), builder, findings).traces
        manifest = Sealer(bucket, job, spool=tmp).seal(traces, batch_id=batch_id_for(seq))
    return manifest.model_dump(mode="json")
