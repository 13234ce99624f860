"""Why a run failed, in one line per kind of failure: what `tracefleet run` prints before it exits non-zero.

A run has failed when a session's every model call failed, when no session completed, or when nothing
trainable was sealed. The reasons are read from what the run left: each session's result (the stage that failed)
and its capture records' errors (what the engine or the proxy said), grouped so that eight calls refused
for the same reason are one line, `8 of 8 calls rejected by the engine (HTTP 400): …`, not eight.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from tracefleet.contract.capture import CallError, read_capture_log

if TYPE_CHECKING:
    from tracefleet.contract.session import SessionResult

# How a call error reads in a sentence, by its kind (tracefleet.proxy.errors.ErrorKind).
CALL_ERROR_VERBS = {
    "context_length": "rejected by the engine",
    "engine_4xx": "rejected by the engine",
    "engine_5xx": "failed in the engine",
    "engine_timeout": "timed out waiting for the engine",
    "engine_disconnect": "lost the engine mid-answer",
    "engine_unavailable": "could not reach the engine",
    "invalid_request": "refused by the proxy as invalid",
    "too_large": "refused by the proxy as too large",
    "rate_limit": "refused while the policy was paused",
    "client_disconnect": "abandoned by the harness",
    "proxy_shutdown": "cut off by the proxy stopping",
    "internal": "failed in the proxy",
}
SESSION_STATUS_VERBS = {"error": "failed", "timeout": "timed out"}
MESSAGE_CHARS = 240  # one line stays readable in a terminal


@dataclass(frozen=True)
class RunVerdict:
    """Whether a finished run failed, and why (one line per kind of failure)."""

    failed: bool
    reasons: list[str]


def _one_line(text: str | None) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= MESSAGE_CHARS else flat[: MESSAGE_CHARS - 1] + "…"


def _call_errors(results: Iterable[SessionResult]) -> tuple[int, list[CallError]]:
    """(calls recorded, the errors among them) over every session's capture log."""
    calls, errors = 0, []
    for result in results:
        if not result.capture_path:
            continue
        try:
            records = read_capture_log(result.capture_path).records
        except OSError:
            continue
        calls += len(records)
        errors += [r.error for r in records if r.error is not None]
    return calls, errors


def call_error_lines(results: list[SessionResult]) -> list[str]:
    """`N of M calls <verb> (HTTP s): <first message>` per (error kind, status), most frequent first."""
    calls, errors = _call_errors(results)
    groups: Counter[tuple[str, int | None]] = Counter((e.kind, e.status_code) for e in errors)
    first: dict[tuple[str, int | None], str] = {}
    for e in errors:
        first.setdefault((e.kind, e.status_code), e.message)
    lines = []
    for (kind, status), count in groups.most_common():
        verb = CALL_ERROR_VERBS.get(kind, f"failed ({kind})")
        http = f" (HTTP {status})" if status else ""
        lines.append(f"{count} of {calls} calls {verb}{http}: {_one_line(first[(kind, status)])}")
    return lines


def session_failure_lines(results: list[SessionResult]) -> list[str]:
    """`N of M sessions <status> at <stage>: <first error>` per (status, stage), most frequent first."""
    ran = [r for r in results if r.status != "stopped"]
    failed = [r for r in ran if r.status != "completed"]
    groups: Counter[tuple[str, str | None]] = Counter((r.status, r.stage) for r in failed)
    first: dict[tuple[str, str | None], str | None] = {}
    for r in failed:
        first.setdefault((r.status, r.stage), r.error)
    return [
        f"{count} of {len(ran)} sessions {SESSION_STATUS_VERBS.get(status, status)} at {stage or '-'}: "
        f"{_one_line(first[(status, stage)])}"
        for (status, stage), count in groups.most_common()
    ]


def run_verdict(results: list[SessionResult], sealed_traces: int, trainable_tokens: int) -> RunVerdict:
    """Failed when a session's every call failed, no session completed, or nothing a trainer can learn
    from was sealed (no trainable token: failed sessions seal rows without any); the reasons are the
    call-error and session-failure lines, and what was missing."""
    ran = [r for r in results if r.status != "stopped"]
    if not ran:
        return RunVerdict(False, [])
    all_calls_failed = [r for r in ran if r.calls > 0 and r.call_errors >= r.calls]
    none_completed = not any(r.status == "completed" for r in ran)
    failed = bool(all_calls_failed) or none_completed or trainable_tokens == 0
    if not failed:
        return RunVerdict(False, [])
    reasons = call_error_lines(ran) + session_failure_lines(ran)
    if all_calls_failed:
        reasons.insert(0, f"{len(all_calls_failed)} of {len(ran)} sessions had every model call fail")
    if trainable_tokens == 0:
        calls = sum(r.calls for r in ran)
        reasons.append(f"nothing trainable sealed: {sealed_traces} traces, 0 trainable tokens from {len(ran)} sessions "
                       f"and {calls} model calls"
                       + ("" if calls else " (did the harness reach the proxy? see harness.stderr in the work dir)"))
    return RunVerdict(True, reasons)
