"""What a session's pods uploaded, read back typed: the harness pod's result.json (`harness_result`), the
evaluator Job's reward.json (`stored_verdict`) and the capture log. The evaluator Job and the sealer read
them here and nowhere else.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from tracefleet.contract import layout
from tracefleet.bucket import Bucket, ObjectNotFound
from tracefleet.contract.session import SessionPlan, SessionResult, Verdict


def read_result(path: Path, plan: SessionPlan) -> SessionResult | None:
    """A harness pod's result.json, None when there is none; one that does not read is an error result."""
    try:
        return SessionResult.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValidationError as exc:
        return missing_result(plan, f"unreadable {layout.RESULT}: {exc.errors(include_url=False)[0]['msg']}")


def missing_result(plan: SessionPlan, why: str = f"the harness pod left no {layout.RESULT}") -> SessionResult:
    """A session whose harness pod said nothing readable: it did not complete, at an unknown stage (fail
    closed), with the plan's ids only."""
    return SessionResult.for_plan(plan).model_copy(update={"status": "error", "error": why, "harness": None, "model": None})


def harness_result(artifacts: Path, plan: SessionPlan) -> SessionResult:
    """The harness pod's result.json in `artifacts` (or `missing_result`)."""
    return read_result(artifacts / layout.RESULT, plan) or missing_result(plan)


def uploaded_result(bucket: Bucket, job: str, session: int, plan: SessionPlan, dest: Path) -> SessionResult | None:
    """`read_result` of what the session's pod uploaded (dest: a scratch folder)."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        (dest / layout.RESULT).write_bytes(bucket.get(layout.artifacts_prefix(job, session) + layout.RESULT))
    except ObjectNotFound:
        return None
    return read_result(dest / layout.RESULT, plan)


def stored_verdict(bucket: Bucket, job: str, session: int) -> Verdict | None:
    """The evaluator Job's reward.json, None when the session was never judged."""
    try:
        return Verdict.model_validate_json(bucket.get(layout.reward_key(job, session)))
    except ObjectNotFound:
        return None


def download_capture(bucket: Bucket, job: str, session: int, dest: Path) -> Path | None:
    """The session's capture log at `dest` (None when the harness pod uploaded none)."""
    try:
        dest.write_bytes(bucket.get(layout.capture_key(job, session)))
    except ObjectNotFound:
        return None
    return dest
