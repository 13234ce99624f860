"""The capture log: the proxy's durable record of every model call, one JSON line per call.

This is the contract between the proxy (writer) and the trace builders (reader). One file per
session, append-only. A record is written, flushed and fsync'd before the answer's last byte
reaches the harness (nothing a harness was answered is lost), so a crash can leave at most one torn final line,
which `read_capture_log` reports instead of dropping silently.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tracefleet.contract.engine_limits import Limit, LogprobsMode

CAPTURE_SCHEMA_VERSION = 1

Dialect = Literal["openai-chat", "openai-responses", "anthropic", "google", "completions"]
CaptureMode = Literal["server", "exact"]
CallStatus = Literal["ok", "error", "partial"]


class CallError(BaseModel):
    """Why a call did not complete. `kind` is a stable machine-readable label (metrics use it)."""

    kind: str  # e.g. engine_timeout, engine_disconnect, context_length, engine_4xx, engine_5xx, client_disconnect
    message: str
    status_code: int | None = None
    # engine_timeout: the limit that cut the call (connect | first_token | inter_token | total), its tokens kept
    limit: Limit | None = None


class SpliceInfo(BaseModel):
    """How the prompt was assembled (exact mode) or checked (server mode)."""

    parent_call_id: str | None = None  # the served call whose exact ids prefix this prompt
    reused_tokens: int = 0  # prompt tokens taken verbatim from earlier served ids
    rendered_tokens: int = 0  # prompt tokens rendered fresh for this call
    matched_messages: int = 0
    new_root_reason: str | None = None  # why no served prefix matched (compaction, sub-agent, ...)
    drift: bool = False  # server mode: engine prompt does not extend parent prompt + completion


class Timings(BaseModel):
    received_at: float  # unix seconds, request fully read
    engine_sent_at: float | None = None
    first_token_at: float | None = None
    done_at: float | None = None


class CaptureRecord(BaseModel):
    """One model call as the engine saw it. Token lists are the engine's own ids."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = CAPTURE_SCHEMA_VERSION
    type: Literal["call"] = "call"
    call_id: str
    session_id: str
    dialect: Dialect
    mode: CaptureMode = "server"
    status: CallStatus = "ok"
    stream: bool = False

    requested_model: str | None = None  # what the harness asked for
    engine_model: str | None = None  # what the engine served
    engine_url: str | None = None
    policy_version: int = 0

    timings: Timings
    request: dict[str, Any] | None = None  # the original body as the harness sent it
    request_ref: str | None = None  # path of the body on disk when it was too large to inline
    canonical: dict[str, Any] | None = None  # the canonical conversation (proxy.canonical)
    headers: dict[str, str] = Field(default_factory=dict)  # selected, non-secret request headers

    prompt_ids: list[int] = Field(default_factory=list)
    completion_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)  # one per completion id
    finish_reason: str | None = None
    output_text: str | None = None
    reasoning_text: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    tool_parse_errors: list[str] = Field(default_factory=list)  # unparsed tool calls: fail closed

    splice: SpliceInfo | None = None
    error: CallError | None = None
    prompt_tokens: int = 0  # the engine's usage counts (the id list lengths when it reported none)
    completion_tokens: int = 0
    # the sampling parameters sent, each {"value", "source": "request" | "proxy" | "engine_default"}: vLLM fills
    # omitted ones from the model's generation_config.json, and its default logprobs are taken before them
    sampling: dict[str, Any] | None = None
    # what the logprobs are (vLLM --logprobs-mode): processed_logprobs (the distribution that sampled, after
    # temperature/top-k/top-p: behaviour logprobs), raw_logprobs (before them), unknown (nobody said);
    # absent in records written before it was recorded
    logprobs_mode: LogprobsMode | None = None
    # what makes the record suspect, e.g. "token_count_mismatch": len(completion_ids), the engine's
    # usage.completion_tokens and len(logprobs) disagree (a trainer should not trust its ids/logprobs)
    flags: list[str] = Field(default_factory=list)
    # the engine's [{version, start, end}] spans over the output tokens, where it reports them (vLLM v0.33);
    # otherwise policy_version (taken when the call was admitted) is all there is
    weight_versions: list[dict[str, Any]] | None = None
    # answered by the session's guide (a demonstration: the scripted engine playing the task's plan), not sampled by
    # the policy: the trace builder makes its completion context (loss mask 0, no span, no policy version), never a
    # trainable token; the calls after it are conditioned on it (a guided prefix, docs/training/real-harness.md)
    guided: bool = False


class CaptureLog(BaseModel):
    records: list[CaptureRecord]
    torn_tail: bool = False  # the last line was incomplete (a crash mid-write)
    torn_bytes: int = 0
    bad_lines: list[int] = Field(default_factory=list)  # 1-based line numbers that failed to parse


def encode_record(record: CaptureRecord) -> bytes:
    # pydantic's own JSON writer: the same bytes as orjson over model_dump(mode="json"), without
    # building the intermediate dicts (it runs before the answer's last byte on every call)
    return record.model_dump_json(exclude_none=True).encode() + b"\n"


class CaptureWriter:
    """Append-only, fsync-per-record writer for one session's capture log."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: CaptureRecord) -> None:
        self.append_encoded(encode_record(record))

    def append_encoded(self, data: bytes) -> None:
        """Append already-encoded record line(s) (`encode_record` output, possibly several joined:
        one fsync then covers them all) and fsync."""
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_capture_log(path: str | os.PathLike[str]) -> CaptureLog:
    """Read a capture log. A final line without its newline is a torn write: reported, not parsed."""
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    records: list[CaptureRecord] = []
    bad: list[int] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(CaptureRecord.model_validate_json(line))
        except ValueError:
            bad.append(number)
    return CaptureLog(records=records, torn_tail=bool(tail), torn_bytes=len(tail), bad_lines=bad)
