"""One call in flight, from take-off to landing, the same for a streamed and a whole answer.

`CallContext` is an admitted call (session, dialect, request, record head, state). `Flight` is its
lifecycle, entered as an async context manager by the task answering it: it counts the call in flight,
turns the client's disconnect into a cut-off, iterates the token engine (`Flight.events`), makes the
record durable (`record`, before the answer's final byte), and on a cut-off (client_disconnect,
session_closed, proxy_shutdown) records what was produced, closes the engine request, tells a harness
still connected and lands. `Flights` holds the calls in flight of every session, to cut them off when a
session closes or the proxy stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from tracefleet.proxy.canonical import Conversation
from tracefleet.proxy.recording import Persister, RecordHead, encode_record_line
from tracefleet.proxy.dialects import DialectCodec
from tracefleet.proxy.errors import ProxyError
from tracefleet.proxy.metrics import ProxyMetrics
from tracefleet.proxy.sessions import Session
from tracefleet.proxy.token_engine import CallState, TokenEngine
from tracefleet.proxy.versions import EngineVersions


@dataclass(slots=True)
class CallContext:
    """An admitted call: who made it, in which dialect, what it asks, its record's head and its state."""

    session: Session
    dialect: DialectCodec
    conv: Conversation
    head: RecordHead
    state: CallState


CLIENT_DISCONNECT, SESSION_CLOSED, PROXY_SHUTDOWN = "client_disconnect", "session_closed", "proxy_shutdown"
ABANDON_MESSAGES = {
    CLIENT_DISCONNECT: "the client disconnected before the answer completed",
    SESSION_CLOSED: "the session was closed while the call was in flight",
    PROXY_SHUTDOWN: "the proxy is shutting down; retry the call",
}


def call_error(exc: Exception) -> ProxyError:
    """What a failed call records and answers: its ProxyError, or a proxy bug as an `internal` one (a bug
    must still leave a record and a well-formed answer)."""
    if isinstance(exc, ProxyError):
        return exc
    return ProxyError("internal", f"proxy error: {type(exc).__name__}: {exc}")


class Flight:
    """One call's lifecycle; `async with flight:` in the task that answers it.

    Inside: iterate `events` (the token engine's, closed on the way out whatever happens), then
    `await record(error)` before the answer's final byte, and `observe()` once it is on its way. A cut-off
    cancels the task; leaving the block records the call (`reason`, with what the engine had produced),
    closes the engine request, calls `tell(error)` when the harness is still there to hear it, and
    swallows the cancellation (`cut_off` is then true): the caller answers `error` if it still can."""

    __slots__ = ("ctx", "state", "events", "task", "reason", "closing", "cut_off", "landed",
                 "_flights", "_receive", "_tell", "_watcher")

    def __init__(self, flights: Flights, ctx: CallContext, receive: Any,
                 tell: Callable[[ProxyError], Awaitable[None]] | None = None) -> None:
        self.ctx, self.state = ctx, ctx.state
        self.events: AsyncIterator[Any] = flights.engine.generate(ctx.conv, ctx.state)
        self.task: asyncio.Task[Any] | None = None
        self.reason: str | None = None  # why it is being cut off: client_disconnect | session_closed | proxy_shutdown
        self.closing = False  # its final event is being sent (or it is landing): no longer cut off
        self.cut_off = False  # it was cut off, recorded, and the cancellation swallowed
        self.landed = asyncio.Event()
        self._flights, self._receive, self._tell = flights, receive, tell
        self._watcher: asyncio.Task[None] | None = None

    @property
    def error(self) -> ProxyError:
        """A cut-off call's error (what its harness is answered)."""
        return self.state.error or ProxyError(self.reason or PROXY_SHUTDOWN, "")

    async def __aenter__(self) -> Flight:
        flights = self._flights
        task = self.task = asyncio.current_task()
        flights.count += 1
        flights.by_session.setdefault(self.state.session_id, set()).add(self)
        if flights.stopping:  # admitted while the proxy shuts down: cut off at its first wait, recorded like the others
            self.reason = PROXY_SHUTDOWN
            task.cancel()  # type: ignore[union-attr]
        self._watcher = self._watching()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        flights = self._flights
        flights.count -= 1
        self.closing = True
        self._watcher.cancel()  # type: ignore[union-attr]
        self._watcher = None  # no reference cycle left for the garbage collector (flight <-> task)
        ours = False
        try:
            if exc_type is not None and issubclass(exc_type, asyncio.CancelledError):
                # the harness went away, its session ended, or the server is stopping: the partial call is
                # still recorded (inline: an await could be cancelled again)
                self._abandon()
                ours = self.reason is not None and self.task.uncancel() == 0  # type: ignore[union-attr]
            if getattr(self.events, "ag_frame", True) is not None:  # not run to its end (an error, a cut-off)
                try:
                    # closing the engine's generator closes its engine request: that is what makes vLLM abort it
                    await self.events.aclose()  # type: ignore[attr-defined]
                except BaseException:  # noqa: BLE001 - the call is recorded already; nothing is left to tell
                    pass
            tell, self._tell = self._tell, None  # (nor flight <-> answer)
            if ours and self.reason != CLIENT_DISCONNECT and tell is not None:
                with contextlib.suppress(Exception):
                    await tell(self.error)
        finally:
            calls = flights.by_session.get(self.state.session_id)
            if calls is not None:
                calls.discard(self)
            self.landed.set()
        self.cut_off = ours
        return ours

    def _watching(self) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """Turn the client's disconnect into a cut-off (its engine request with it).

        Once the request body is read, the server's `receive` returns only when the client goes away
        (or the answer is complete, when this watcher is no longer needed)."""
        receive = self._receive
        while (await receive())["type"] != "http.disconnect":
            pass
        if self.reason is None and not self.closing:
            self.reason = CLIENT_DISCONNECT
            self.task.cancel()  # type: ignore[union-attr]

    def cut(self, reason: str) -> bool:
        """Cut the call off for `reason` unless it is already being cut off, answered or recorded."""
        if self.reason is not None or self.closing or self.state.done_at is not None or self.task is None:
            return False
        self.reason = reason
        self.task.cancel()
        return True

    def _line(self) -> bytes:
        return encode_record_line(self.ctx.head, self.state, self._flights.engine.splice_info(self.state.call_id))

    async def record(self, error: ProxyError | None = None) -> None:
        """The call's outcome made durable in its session's log (before the answer's final byte)."""
        state = self.state
        if error is not None:
            state.error = error
        state.done_at = time.time()
        flights = self._flights
        await flights.versions.settle(state)
        await flights.persist(self.ctx.session, self._line(), state.error is not None, alone=flights.count <= 1)

    def observe(self) -> None:
        """The call's metrics (off the answer's critical path)."""
        state, m, name = self.state, self._flights.metrics, self.ctx.dialect.name
        error = state.error
        m.calls.labels(name, "200" if error is None else str(error.status)).inc()
        m.prompt_tokens.labels(name).inc(state.prompt_tokens)
        m.completion_tokens.labels(name).inc(state.completion_tokens)
        if state.first_token_at is not None:
            m.ttft.labels(name).observe(max(0.0, state.first_token_at - state.received_at))
        m.latency.labels(name).observe(max(0.0, (state.done_at or time.time()) - state.received_at))
        if error is not None:
            m.errors.labels(error.kind).inc()
            if error.limit is not None:
                m.engine_timeouts.labels(error.limit).inc()

    def _abandon(self) -> None:
        """Record a call cut off before its record was written."""
        state = self.state
        if state.done_at is not None:
            return
        # no reason: cancelled by the server itself (its graceful-shutdown timeout ran out)
        kind = self.reason or (PROXY_SHUTDOWN if self._flights.stopping else CLIENT_DISCONNECT)
        state.error = ProxyError(kind, ABANDON_MESSAGES[kind])
        state.done_at = time.time()
        self._flights.versions.stamp(state)
        session = self.ctx.session
        session.append_encoded(self._line(), 1, True)
        session.abandoned += 1
        self.observe()
        m = self._flights.metrics
        m.abandoned.labels(self.ctx.dialect.name, kind).inc()
        if state.engine_sent_at is not None:
            m.engine_cancelled.inc()


class Flights:
    """The proxy's calls in flight, by session."""

    __slots__ = ("engine", "persist", "metrics", "versions", "by_session", "count", "stopping")

    def __init__(self, engine: TokenEngine, persist: Persister, metrics: ProxyMetrics, versions: EngineVersions) -> None:
        self.engine, self.persist, self.metrics, self.versions = engine, persist, metrics, versions
        self.by_session: dict[str, set[Flight]] = {}
        self.count = 0  # calls in flight (the persister inlines the fsync when a call is alone)
        self.stopping = False  # the proxy is shutting down: calls in flight are cut off, new ones too

    def take_off(self, ctx: CallContext, receive: Any,
                 tell: Callable[[ProxyError], Awaitable[None]] | None = None) -> Flight:
        """A flight for an admitted call; `receive` is its ASGI receive (watched for the client's disconnect),
        `tell` how to tell a harness still connected that its call was cut off."""
        return Flight(self, ctx, receive, tell)

    def per_session(self) -> Iterator[tuple[str, int]]:
        """(session id, calls in flight) for every session that had calls."""
        return ((sid, len(calls)) for sid, calls in self.by_session.items())

    def forget(self, session_id: str) -> None:
        self.by_session.pop(session_id, None)

    async def abandon(self, session_id: str, reason: str = SESSION_CLOSED, wait_s: float = 5.0) -> int:
        """Cut off every call of a session still in flight and return once each is recorded: how many."""
        return await self._cut_off(list(self.by_session.get(session_id, ())), reason, wait_s)

    async def shut_down(self, wait_s: float = 5.0) -> int:
        """Cut off every call in flight, and calls admitted from now on: how many were cut off."""
        self.stopping = True
        return await self._cut_off([f for calls in self.by_session.values() for f in calls], PROXY_SHUTDOWN, wait_s)

    @staticmethod
    async def _cut_off(flights: list[Flight], reason: str, wait_s: float) -> int:
        cut = sum(flight.cut(reason) for flight in flights)
        if flights:
            await asyncio.wait([asyncio.ensure_future(f.landed.wait()) for f in flights], timeout=wait_s)
        return cut
