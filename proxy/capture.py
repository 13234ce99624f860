"""Glue from a finished (or failed) call to a `tracefleet.capture.CaptureRecord` on disk."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from tracefleet.capture import CallError, CaptureRecord, Timings

from .canonical import Conversation
from .sessions import Session
from .token_engine import CallState

# request headers worth keeping: they identify harness turns/sessions; never credentials
KEPT_HEADERS = ("user-agent", "session-id", "x-session-id", "x-codex-turn-metadata", "anthropic-version",
                "anthropic-beta", "x-stainless-package-version", "x-goog-api-client", "openai-beta")


_KEPT = frozenset(KEPT_HEADERS)


def kept_headers(headers: Any) -> dict[str, str]:
    raw = getattr(headers, "raw", None)  # Starlette Headers: one pass over the ASGI pairs (names lowercase)
    if raw is None:
        return {h: headers[h] for h in KEPT_HEADERS if h in headers}
    out: dict[str, str] = {}
    for key, value in raw:
        name = key.decode("latin-1")
        if name in _KEPT and name not in out:  # the first one wins, as headers[name] would
            out[name] = value.decode("latin-1")
    return out


def build_record(
    state: CallState,
    *,
    conv: Conversation | None,
    request: dict[str, Any] | None,
    request_ref: str | None,
    headers: dict[str, str],
    mode: str,
    engine_url: str,
) -> CaptureRecord:
    err = state.error
    if err is None:
        status = "ok"
    else:
        status = "partial" if state.completion_ids or state.text else "error"
    # model_construct: every field is built here from typed state, so re-validating (which walks the
    # token-id lists, ~13 us per 1k prompt tokens) buys nothing; serialization is unchanged.
    return CaptureRecord.model_construct(
        call_id=state.call_id,
        session_id=state.session_id,
        dialect=state.dialect,  # type: ignore[arg-type]
        mode=mode,  # type: ignore[arg-type]
        status=status,  # type: ignore[arg-type]
        stream=state.stream,
        requested_model=state.requested_model,
        engine_model=state.engine_model,
        engine_url=engine_url,
        policy_version=state.policy_version,
        timings=Timings(received_at=state.received_at, engine_sent_at=state.engine_sent_at,
                        first_token_at=state.first_token_at, done_at=state.done_at),
        request=request,
        request_ref=request_ref,
        canonical=conv.model_dump(mode="json", exclude_defaults=True) if conv is not None else None,
        headers=headers,
        prompt_ids=state.prompt_ids,
        completion_ids=state.completion_ids,
        logprobs=state.logprobs,
        finish_reason=state.finish_reason,
        output_text=state.output_text or None,
        reasoning_text=state.reasoning_text or None,
        tool_calls=[tc.model_dump() for tc in state.tool_calls],
        tool_parse_errors=state.tool_parse_errors,
        error=CallError(kind=err.kind, message=err.message, status_code=err.status) if err else None,
        prompt_tokens=state.prompt_tokens,
        completion_tokens=state.completion_tokens,
    )


def spill_body(capture_dir: Path, session_id: str, call_id: str, body: bytes) -> str:
    """Write an oversized request body next to the log (fsync'd) and return its path."""
    folder = capture_dir / f"{session_id}.bodies"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{call_id}.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return str(path)


class Persister:
    """Makes records durable (append + fsync) before the caller answers.

    An fsync on a fast device (tmpfs, NVMe) costs tens of microseconds, less than handing the work
    to a thread (~250 us on a busy box); on a slow disk it can take milliseconds, which must not
    stall every other stream on the event loop. So: measure, and append inline while the running
    average stays under `inline_below_s`, in a worker thread otherwise (re-probing inline now and
    then so a disk that got faster is noticed).
    """

    def __init__(self, inline_below_s: float = 0.0003) -> None:
        self.inline_below_s = inline_below_s
        self.avg_s = 0.0
        self._offloaded = 0

    async def __call__(self, session: Session, record: CaptureRecord) -> None:
        if self.avg_s < self.inline_below_s or self._offloaded >= 256:
            self._offloaded = 0
            t0 = time.perf_counter()
            session.append(record)
            self.avg_s = 0.8 * self.avg_s + 0.2 * (time.perf_counter() - t0)
        else:
            self._offloaded += 1
            await asyncio.to_thread(session.append, record)
