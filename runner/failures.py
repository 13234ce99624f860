"""Why a run failed, in one line per kind of failure: what `tracefleet run` prints before it exits non-zero.

A run has failed when a session's every model call failed, when no session completed, or when nothing
trainable was sealed. The reasons are read from what the run left: each session's result (the stage that failed)
and its capture records' errors (what the engine or the proxy said), grouped so that eight calls refused
for the same reason are one line, `8 of 8 calls rejected by the engine (HTTP 400): …`, not eight.

A harness that exits non-zero says why in its own output, not in its exit code (Codex's `turn.failed` event
"Incomplete response returned, reason: max_output_tokens", Claude Code's result "API Error: Claude's response
exceeded the 32000 output token maximum", a plain `Error: …` on stderr): `harness_reason` reads it back from
the tails of harness.stdout/stderr by one rule for every harness, so `harness exited 1` becomes
`harness exited 1: <the harness's last reason>`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from tracefleet.contract import layout
from tracefleet.contract.capture import CallError, read_capture_log
from tracefleet.contract.semantics import OUTCOME_KIND_MEANING, OUTCOME_KIND_WORDS, OutcomeCounts, OutcomeKind

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
TAIL_BYTES = 64 * 1024  # of each harness output file: its last reason is near the end
# A plain-text line that reports a failure (`Error: …`, `ValueError: …`, `fatal: …`, `… exceeded …`).
ERROR_LINE = re.compile(r"error|exception|fail|fatal|exceeded|refused|denied|invalid|unable to|cannot|timed? ?out",
                        re.IGNORECASE)
# A JSON event (the harnesses' --json / stream-json output) that reports a failure, and where its words are.
ERROR_EVENT_TYPE = re.compile(r"error|fail", re.IGNORECASE)
MESSAGE_KEYS = ("message", "errorMessage", "result", "error", "detail", "data")
HARNESS_EXITED = "harness exited "  # runner.session.wait_stage's words for a non-zero exit (the reason follows)


@dataclass(frozen=True)
class RunVerdict:
    """Whether a finished run failed, and why (one line per kind of failure)."""

    failed: bool
    reasons: list[str]


def _one_line(text: str | None) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= MESSAGE_CHARS else flat[: MESSAGE_CHARS - 1] + "…"


def _event_message(value: Any, depth: int = 0) -> str | None:
    """The first non-empty string under MESSAGE_KEYS (nested: `{"error": {"data": {"message": …}}}`)."""
    if isinstance(value, str):
        return value.strip() or None
    if not isinstance(value, dict) or depth > 3:
        return None
    for key in MESSAGE_KEYS:
        if (found := _event_message(value.get(key), depth + 1)) is not None:
            return found
    return None


def _reports_error(event: dict[str, Any]) -> bool:
    kinds = " ".join(str(event.get(k, "")) for k in ("type", "subtype", "stopReason", "status"))
    return event.get("is_error") is True or bool(ERROR_EVENT_TYPE.search(kinds)) or bool(event.get("error"))


def _error_event(line: str) -> str | None:
    """The message of a JSON line that reports a failure: `is_error: true` (Claude Code's result), an `error`
    or `…failed` type or subtype (Codex's turn.failed, OpenCode's error), `stopReason: error` (Pi, also on the
    event's `message`), `status: error`, or an `error` field; None for any other line. Only the event and its
    `message` are looked at: deeper down are tool results (a failed shell command is not the harness failing)."""
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict):
        return None
    for part in (event, event.get("message")):
        if isinstance(part, dict) and _reports_error(part):
            return _event_message(part)
    return None


def _tail_lines(path: Path) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip()]


def harness_reason(session_dir: str | Path) -> str | None:
    """The harness's own last reason for failing, read from the ends of its stdout and stderr, one line:
    the last JSON error event on either (the structured outputs say it most precisely), else the last
    error-looking plain line (stderr first: that is where CLIs write errors), else stderr's last line."""
    out = _tail_lines(Path(session_dir) / layout.HARNESS_STDOUT)
    err = _tail_lines(Path(session_dir) / layout.HARNESS_STDERR)
    for lines in (out, err):
        for line in reversed(lines):
            if (message := _error_event(line)) is not None:
                return _one_line(message)
    for lines in (err, out):
        for line in reversed(lines):
            if not line.startswith("{") and ERROR_LINE.search(line):
                return _one_line(line)
    return _one_line(err[-1]) if err else None


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


def what_happened(r: SessionResult) -> str:
    """A session that did not complete, in a few words: `failed at harness`, `timed out at evaluate`, and `could not
    be judged (evaluator unavailable)` for an evaluator that could not run or report (recorded as an error at
    evaluate, but the infrastructure's: tracefleet.contract.semantics)."""
    if r.evaluation is not None and r.evaluation.status == "unavailable":
        return "could not be judged (evaluator unavailable)"
    return f"{SESSION_STATUS_VERBS.get(r.status, r.status)} at {r.stage or '-'}"


def whose(r: SessionResult) -> str:
    """Whose outcome a session is, in the words every surface uses, with what it means for training where it is
    left out of it."""
    if r.outcome_kind is None:
        return "not classified"
    meaning = f": {OUTCOME_KIND_MEANING[r.outcome_kind]}" if r.outcome_kind == OutcomeKind.INFRASTRUCTURE else ""
    return OUTCOME_KIND_WORDS[r.outcome_kind] + meaning


def failure_line(r: SessionResult) -> str:
    """One failed session as the run reports it when it ends."""
    return f"{what_happened(r)} ({whose(r)}): {r.error}"


def status_line(results: list[SessionResult]) -> str:
    """The run's sessions: completed, then the others by whose failure they are, each with what happened; an
    evaluator that could not run is the infrastructure's, not counted as an `error`. (Completed sessions that are
    fail-closed all the same are counted by kind in the summary's `outcomes`.)"""
    completed = stopped = 0
    failed: dict[str, Counter[str]] = {}
    for r in results:
        if r.status == "stopped":
            stopped += 1
        elif r.status == "completed":
            completed += 1
        else:
            words = "failed" if r.outcome_kind is None else f"{OUTCOME_KIND_WORDS[r.outcome_kind]} failures"
            failed.setdefault(words, Counter())[what_happened(r)] += 1
    parts = [f"completed {completed}"]
    for words, what in sorted(failed.items()):
        parts.append(f"{words} {sum(what.values())} (" + ", ".join(f"{w} {n}" for w, n in what.most_common()) + ")")
    return ", ".join(parts + ([f"stopped {stopped}"] if stopped else []))


def session_failure_lines(results: list[SessionResult]) -> list[str]:
    """`N of M sessions <what happened>: <first error>` per what happened, most frequent first."""
    ran = [r for r in results if r.status != "stopped"]
    failed = [r for r in ran if r.status != "completed"]
    groups: Counter[str] = Counter(what_happened(r) for r in failed)
    first: dict[str, str | None] = {}
    for r in failed:
        first.setdefault(what_happened(r), r.error)
    return [f"{count} of {len(ran)} sessions {what}: {_one_line(first[what])}" for what, count in groups.most_common()]


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


def outcomes_line(counts: OutcomeCounts) -> str:
    """The sealed sessions by outcome kind (tracefleet.contract.semantics), one line: the run's summary shows what
    the operator's status.counters.infrastructure counts."""
    ok, policy, infra = (OUTCOME_KIND_WORDS[k] for k in OutcomeKind)
    return (f"{ok} {counts.ok}, {policy} failures {counts.policy}, {infra} {counts.infrastructure}"
            + (f" ({OUTCOME_KIND_MEANING[OutcomeKind.INFRASTRUCTURE]})" if counts.infrastructure else "")
            + " (sessions in sealed batches)")
