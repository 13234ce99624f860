"""Glue from a finished (or failed) call to a `tracefleet.contract.capture.CaptureRecord` on disk."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from tracefleet.contract.capture import CAPTURE_SCHEMA_VERSION, SpliceInfo

from tracefleet.proxy.canonical import Conversation
from tracefleet.proxy.sessions import Session
from tracefleet.proxy.token_engine import CallState

# request headers worth keeping: they identify harness turns/sessions; never credentials
KEPT_HEADERS = ("user-agent", "session-id", "x-session-id", "x-codex-turn-metadata", "anthropic-version",
                "anthropic-beta", "x-stainless-package-version", "x-goog-api-client", "openai-beta")


_KEPT = frozenset(KEPT_HEADERS)


def kept_headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The kept headers from an ASGI scope's header pairs (lowercase names; the first one wins)."""
    out: dict[str, str] = {}
    for key, value in raw:
        name = key.decode("latin-1")
        if name in _KEPT and name not in out:
            out[name] = value.decode("latin-1")
    return out


class RecordHead:
    """The part of a call's capture record known once the request is admitted (ids, the request, its
    canonical form, headers), encoded while the engine works. `encode_record_line` adds what the
    engine produced and writes the line a `CaptureRecord` reads back (tests/proxy/test_capture_encoding.py
    checks the two agree). orjson rather than `CaptureRecord.model_dump_json`: this runs before the
    answer's last byte on every call, and building the pydantic model only to serialize it cost ~3x."""

    __slots__ = ("fields", "encoded")

    def __init__(self, state: CallState, *, conv: Conversation | None, request: dict[str, Any] | None,
                 request_ref: str | None, headers: dict[str, str], mode: str, engine_url: str) -> None:
        self.fields: dict[str, Any] | None = _without_none({
            "schema_version": CAPTURE_SCHEMA_VERSION, "type": "call", "call_id": state.call_id,
            "session_id": state.session_id, "dialect": state.dialect, "mode": mode, "stream": state.stream,
            "requested_model": state.requested_model, "engine_url": engine_url,
            "policy_version": state.policy_version, "request": request, "request_ref": request_ref,
            "canonical": conv, "headers": headers, "guided": True if state.guided else None,
        })
        self.encoded: bytes | None = None

    def encode(self) -> bytes:
        """The head as a JSON object (idempotent; the first call dumps the canonical conversation)."""
        if self.encoded is None:
            fields = self.fields
            assert fields is not None
            if fields.get("canonical") is not None:
                fields["canonical"] = canonical_dump(fields["canonical"])
            self.encoded = _dumps(fields)
            self.fields = None  # the request dicts are no longer needed in memory
        return self.encoded


def encode_record_line(head: RecordHead, state: CallState, splice: SpliceInfo | None) -> bytes:
    """One capture-log line: the head's fields, then the outcome (status, timings, token ids, ...)."""
    state.settle_usage()  # whatever ended the call: a cut or abandoned one counts the ids it holds
    err = state.error
    tail = _without_none({
        "status": "ok" if err is None else "partial" if state.completion_ids or state.text else "error",
        "engine_model": state.engine_model,
        "timings": _without_none({"received_at": state.received_at, "engine_sent_at": state.engine_sent_at,
                                  "first_token_at": state.first_token_at, "done_at": state.done_at}),
        "prompt_ids": state.prompt_ids,
        "completion_ids": state.completion_ids,
        "logprobs": state.logprobs,
        "finish_reason": state.finish_reason,
        "output_text": state.output_text or None,
        "reasoning_text": state.reasoning_text or None,
        "tool_calls": [{"id": tc.id, "name": tc.name, "arguments": tc.arguments, "kind": tc.kind}
                       for tc in state.tool_calls],
        "tool_parse_errors": state.tool_parse_errors,
        "splice": splice.model_dump(exclude_none=True) if splice is not None else None,
        "error": _without_none({"kind": err.kind, "message": err.message, "status_code": err.status,
                                "limit": err.limit}) if err else None,
        "prompt_tokens": state.prompt_tokens,
        "completion_tokens": state.completion_tokens,
        "sampling": state.sampling,
        "logprobs_mode": state.logprobs_mode,
        "flags": state.flags or None,
        "weight_versions": state.weight_versions,
    })
    return head.encode()[:-1] + b"," + _dumps(tail)[1:] + b"\n"


def _without_none(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:  # what orjson refuses (an integer beyond 64 bits in a request body): the stdlib writes it
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str).encode()


def canonical_dump(conv: Conversation | None) -> dict[str, Any] | None:
    return conv.model_dump(mode="json", exclude_defaults=True) if conv is not None else None


def precompute_head(head: RecordHead) -> None:
    """Scheduled with call_soon when a call starts: it then runs while the engine is working (the
    task's first wait), instead of between the engine's last byte and the harness's."""
    head.encode()


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

    Inline, on the event loop, whenever that stalls nobody for long: on a fast device (tmpfs, NVMe:
    tens of microseconds, less than any thread handoff), and on a slower one while this is the only
    call in flight (`alone`: a handoff would only add two thread wake-ups to the fsync). Otherwise one
    writer thread per proxy takes the appends and group-commits: the records of a session that queued
    up while it was busy go down in one write and one fsync, each caller resumed only after that.
    """

    def __init__(self, inline_below_s: float = 0.0003, alone_below_s: float = 0.005) -> None:
        self.inline_below_s = inline_below_s
        self.alone_below_s = alone_below_s
        self.avg_s = 0.0  # running average of write + fsync (encoding excluded)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def __call__(self, session: Session, data: bytes, failed: bool, alone: bool = False) -> None:
        """Append `data` (one encoded record line; `failed`: its call did not complete) durably."""
        avg = self.avg_s
        if avg < self.inline_below_s or (alone and avg < self.alone_below_s):
            t0 = time.perf_counter()
            session.append_encoded(data, 1, failed)
            self.avg_s = 0.8 * avg + 0.2 * (time.perf_counter() - t0)
            return
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._writer, name="tracefleet-capture-writer", daemon=True)
            self._thread.start()
        self._queue.put((session, data, failed, loop, done))
        await done

    def close(self, wait_s: float = 5.0) -> None:
        """Stop the writer thread once it has written what was queued (it is a daemon: an exiting process
        would otherwise drop records still in its queue)."""
        thread = self._thread
        if thread is not None:
            self._queue.put(None)
            self._thread = None
            thread.join(wait_s)

    def _writer(self) -> None:
        q = self._queue
        while True:
            items = [q.get()]
            while True:
                try:
                    items.append(q.get_nowait())
                except queue.Empty:
                    break
            groups: dict[int, list[Any]] = {}
            for item in items:
                if item is not None:
                    groups.setdefault(id(item[0]), []).append(item)
            for group in groups.values():
                t0 = time.perf_counter()
                err: BaseException | None = None
                try:
                    group[0][0].append_encoded(b"".join(it[1] for it in group), len(group), sum(it[2] for it in group))
                except BaseException as exc:  # the callers get it, as they would inline
                    err = exc
                self.avg_s = 0.8 * self.avg_s + 0.2 * (time.perf_counter() - t0)
                by_loop: dict[int, tuple[Any, list[Any]]] = {}
                for it in group:
                    by_loop.setdefault(id(it[3]), (it[3], []))[1].append(it[4])
                for loop, futures in by_loop.values():
                    with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                        loop.call_soon_threadsafe(_settle, futures, err)
            if None in items:
                return


def _settle(futures: list[asyncio.Future[None]], err: BaseException | None) -> None:
    for fut in futures:
        if not fut.done():  # a caller cancelled meanwhile still had its record written
            if err is None:
                fut.set_result(None)
            else:
                fut.set_exception(err)
