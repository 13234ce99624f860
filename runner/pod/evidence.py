"""Session evidence on the pod path: the same builder as local mode (tracefleet.diagnostics.evidence.
session_evidence) over what the session's pods uploaded. The evaluator Job builds it after judging (it
holds the task, the patch and the judging) and writes it to layout.evidence_key; the sealer reads that,
or, for a session that was never judged (no evaluator Job ran), builds it from the uploads itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracefleet.contract import layout
from tracefleet.bucket import Bucket, ObjectNotFound
from tracefleet.diagnostics.evidence import HarnessEvidence, SessionEvidence, read_tail, session_evidence


def uploaded_evidence(*, job: str, session_id: str, task: Any, group_id: str | None, sample_index: int,
                      artifacts: Path, capture: Path | None, evaluation: Any, policy_version: int | None = None
                      ) -> SessionEvidence:
    """Evidence from the harness pod's artifacts folder (session.patch, result.json, harness.stderr) and
    its capture log, with the evaluation (the reward.json body or None) and the job's policy version."""
    result_file = artifacts / layout.RESULT
    harness = json.loads(result_file.read_text()) if result_file.exists() else {}
    patch_file = artifacts / layout.PATCH
    return session_evidence(
        job=job, session_id=session_id, task=task, group_id=group_id, sample_index=sample_index, capture=capture,
        patch=patch_file.read_text() if patch_file.exists() else "",
        harness=HarnessEvidence(preset=harness.get("harness"), status=harness.get("status") or "error",
                                stage=harness.get("stage"), error=harness.get("error"),
                                exit_code=harness.get("harness_exit_code"), stderr_tail=read_tail(artifacts / layout.HARNESS_STDERR)),
        evaluation=evaluation, timings=harness.get("timings") or {}, policy_version=policy_version,
    )


def download_capture(bucket: Bucket, job: str, session: int, dest: Path) -> Path | None:
    """The session's capture log at `dest` (None when the harness pod uploaded none)."""
    try:
        dest.write_bytes(bucket.get(layout.capture_key(job, session)))
    except ObjectNotFound:
        return None
    return dest
