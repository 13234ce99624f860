"""Sessions and their credentials. A session exists only if the runner/operator created it; an
unknown or wrong credential is refused, never given a fresh session (design invariant 5)."""

from __future__ import annotations

import hmac
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracefleet.contract.capture import CaptureWriter
from tracefleet.contract.proxy_admin import ProxySession
from tracefleet.proxy.errors import ProxyError

_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


@dataclass
class Session:
    session_id: str
    secret: str
    capture_path: Path
    metadata: dict[str, Any] = field(default_factory=dict)
    guided_calls: int = 0  # its first calls answered by the guide engine (a guided prefix)
    admitted: int = 0  # calls admitted so far (a guided one counts when admitted, not when recorded)
    calls: int = 0
    errors: int = 0
    abandoned: int = 0  # calls cut off in flight (client gone, session closed); also counted in `errors`
    active: bool = True
    _writer: CaptureWriter | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def append_encoded(self, data: bytes, records: int = 1, failed: int = 0) -> None:
        """Append + fsync `records` already-encoded lines (`proxy.capture.encode_record_line` output, joined), `failed` of
        them not ok: one fsync for a group of calls that finished together."""
        with self._lock:
            if self._writer is None:
                self._writer = CaptureWriter(self.capture_path)
            self._writer.append_encoded(data)
            self.calls += records
            self.errors += failed

    def admit(self) -> bool:
        """Count a call in; whether the guide answers it (one of the session's first `guided_calls`)."""
        with self._lock:
            self.admitted += 1
            return self.admitted <= self.guided_calls

    def close(self) -> None:
        with self._lock:
            self.active = False
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def info(self) -> ProxySession:
        return ProxySession(session_id=self.session_id, calls=self.calls, errors=self.errors, abandoned=self.abandoned,
                            capture_path=str(self.capture_path), active=self.active, metadata=self.metadata,
                            guided_calls=self.guided_calls)


class SessionStore:
    def __init__(self, capture_dir: Path) -> None:
        self.capture_dir = Path(capture_dir)
        self.capture_dir.mkdir(parents=True, exist_ok=True)
        self._by_id: dict[str, Session] = {}
        self._by_secret: dict[str, Session] = {}

    def create(self, session_id: str | None = None, secret: str | None = None,
               metadata: dict[str, Any] | None = None, guided_calls: int = 0) -> Session:
        sid = session_id or "s-" + secrets.token_hex(8)
        if not sid or len(sid) > 128 or not set(sid) <= _ID_CHARS or sid.startswith("."):
            raise ProxyError("invalid_request", f"invalid session_id {sid!r}: use 1-128 of [A-Za-z0-9._-]", param="session_id")
        if sid in self._by_id:
            raise ProxyError("invalid_request", f"session {sid!r} already exists", status=409, param="session_id")
        session = Session(session_id=sid, secret=secret or "tfs-" + secrets.token_urlsafe(24),
                          capture_path=self.capture_dir / f"{sid}.jsonl", metadata=dict(metadata or {}),
                          guided_calls=guided_calls)
        self._by_id[sid] = session
        self._by_secret[session.secret] = session
        return session

    def get(self, session_id: str) -> Session | None:
        return self._by_id.get(session_id)

    def active_count(self) -> int:
        return sum(1 for s in self._by_id.values() if s.active)

    def authenticate(self, key: str | None, path_session: str | None) -> Session:
        if not key:
            raise ProxyError("authentication", "missing API key: send the session secret as Authorization: Bearer, "
                             "x-api-key or x-goog-api-key")
        if path_session is not None:
            session = self._by_id.get(path_session)
            if session is None or not hmac.compare_digest(session.secret, key):
                raise ProxyError("authentication", f"invalid API key for session {path_session!r}")
        else:
            session = self._by_secret.get(key)
            if session is None:
                raise ProxyError("authentication", "invalid API key: no session has this secret")
        if not session.active:
            raise ProxyError("authentication", f"session {session.session_id!r} is closed")
        return session

    def close_all(self) -> None:
        for s in self._by_id.values():
            s.close()
