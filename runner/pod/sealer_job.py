"""The sealer Job's program: seal whole groups of finished sessions as one batch.

`python -m tracefleet.runner.pod seal`. The operator gives the sessions' plans (files: tracefleet.contract.plan_files,
each with its task's id and metadata, the builder, the diagnostics, the policy version) and the batch's job seq;
each session's rows are built from
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
from tracefleet.bucket import Bucket, ObjectNotFound
from tracefleet.contract.session import SessionPlan, SessionResult
from tracefleet.diagnostics.evidence import SessionEvidence, stored_evidence
from tracefleet.contract.layout import batch_id_for
from tracefleet.contract.podenv import PodEnvError
from tracefleet.runner.pod.evidence import download_capture, missing_result, stored_verdict, uploaded_result
from tracefleet.runner.session import evidence_of
from tracefleet.runner.tracing import session_traces


def session_result(bucket: Bucket, plan: SessionPlan, tmp: Path) -> SessionResult:
    """The session as its pods left it, judged: result.json with reward.json's verdict. A session that was
    judged had a harness pod that succeeded (the operator judges no other), so a lost result.json then
    reads as completed; one never judged and without a result.json did not complete (fail closed)."""
    job = plan.job
    verdict = stored_verdict(bucket, job, plan.index)
    result = uploaded_result(bucket, job, plan.index, plan, tmp / f"result-{plan.index}")
    if verdict is None:
        return result or missing_result(plan)
    return (result or SessionResult.for_plan(plan).model_copy(update={"harness": None, "model": None})).judged(verdict)


def session_evidence_of(bucket: Bucket, plan: SessionPlan, result: SessionResult, capture: Path | None,
                        tmp: Path) -> SessionEvidence:
    """The evidence the evaluator Job wrote, or (a session that was never judged) the same builder over
    the harness pod's uploads, without the task's test names (only its id is given here)."""
    job = plan.job
    stored = stored_evidence(bucket, job, result.session_id)
    if stored is not None:
        return stored.model_copy(update={"group_id": plan.group_id})
    artifacts = tmp / f"artifacts-{plan.index}"
    artifacts.mkdir()
    prefix = layout.artifacts_prefix(job, plan.index)
    for name in (layout.PATCH, layout.HARNESS_STDERR):
        try:
            (artifacts / name).write_bytes(bucket.get(prefix + name))
        except ObjectNotFound:
            pass
    patch = artifacts / layout.PATCH
    return evidence_of(result, task={"id": plan.task.id}, capture=capture,
                       patch=patch.read_text() if patch.exists() else "", stderr=artifacts / layout.HARNESS_STDERR,
                       policy_version=None)


def seal(bucket: Bucket, seq: int, plans: list[SessionPlan]) -> dict[str, Any]:
    """Seal the sessions of `plans` (whole groups of one job) as batch k8s-<seq>: every session gives its rows,
    failed ones fail-closed (tracefleet.contract.semantics), each judged by the job's diagnostics (the plans'
    `spec.diagnostics`; None: every built-in, flag only) over its evidence, as in local mode."""
    from tracefleet.diagnostics.registry import configured, run_diagnostics, unavailable
    from tracefleet.runner.tracing import outcome_of
    from tracefleet.traces.seal import Sealer

    if not plans:
        raise PodEnvError("the plans name no session to seal")
    job, builder, policy_version = plans[0].job, plans[0].builder, plans[0].policy_version
    try:
        resolved = configured(plans[0].diagnostics)
    except (ImportError, AttributeError, ValueError) as exc:  # a hook the image cannot import: the manifest's problem
        raise PodEnvError(f"the plans' diagnostics: {type(exc).__name__}: {exc}") from None
    traces: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        for plan in plans:
            result = session_result(bucket, plan, Path(tmp))
            path = download_capture(bucket, job, plan.index, Path(tmp) / f"{result.session_id}.jsonl")
            try:
                evidence = session_evidence_of(bucket, plan, result, path, Path(tmp)).model_copy(
                    update={"policy_version": policy_version})
            except Exception as exc:  # noqa: BLE001 - the session is still sealed; the diagnostics say they could not judge
                findings = unavailable(f"evidence: {type(exc).__name__}: {exc}", resolved)
            else:
                findings = run_diagnostics(evidence, resolved=resolved)
            # no capture: the session's row says so (fail closed)
            traces += session_traces(path, outcome_of(result), builder, findings).traces
        manifest = Sealer(bucket, job, spool=tmp).seal(traces, batch_id=batch_id_for(seq))
    return manifest.model_dump(mode="json")
