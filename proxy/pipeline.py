"""The call pipeline: `Proxy` admits a call (authenticate, read the body, parse the dialect, pause
bound), runs it through the token engine, records it and answers (whole, or as an `EventStream`).

Hot path per call: authenticate → read body (bounded) → dialect.parse → admit (pause bound) →
token engine → render (streamed as the engine produces) → fsync the capture record → final event.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import orjson
from fastapi.responses import Response
from starlette.datastructures import QueryParams

from .call import ABANDON_MESSAGES, CallContext, Flight, watch_disconnect
from .canonical import Conversation
from .capture import Persister, RecordHead, encode_record_line, kept_headers, precompute_head, spill_body
from .config import ProxyConfig
from .controls import Controls
from .dialects import Dialect
from .engine_client import EngineClient
from .errors import ProxyError
from .exact.engine import ExactTokenEngine
from .exact.metrics import register_exact_metrics
from .metrics import ProxyMetrics
from .mode import ModeDecision, register_mode_metric, select_token_engine
from .sessions import Session, SessionStore
from .sse import EventStream
from .token_engine import CallState, TokenEngine

PATH_SESSION = "tracefleet.path_session"  # the scope key `SessionPrefix` leaves the /s/<id>/ session id under


_CREDENTIALS = frozenset((b"authorization", b"x-api-key", b"x-goog-api-key"))


def api_key(scope: dict[str, Any]) -> str | None:
    """The session secret, wherever the harness's SDK puts it (the first of each header counts)."""
    found: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in _CREDENTIALS and name not in found:
            found[name] = value
    auth = found.get(b"authorization")
    if auth and auth[:7].lower() == b"bearer ":
        return auth[7:].strip().decode("latin-1")
    key = found.get(b"x-api-key") or found.get(b"x-goog-api-key")
    if key:
        return key.decode("latin-1")
    query = scope.get("query_string")
    return QueryParams(query).get("key") if query else None


def header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


class Proxy:
    """Per-app state and the call pipeline."""

    def __init__(self, config: ProxyConfig, token_engine: TokenEngine | None = None) -> None:
        self.config = config
        self.sessions = SessionStore(config.capture_dir)
        for preset in config.sessions:
            self.sessions.create(preset.session_id, preset.secret, preset.metadata)
        self.controls = Controls(policy_version=config.policy_version, max_wait_s=config.pause_max_wait_s,
                                 retry_after_s=config.retry_after_s)
        self.metrics = ProxyMetrics()
        self.client = EngineClient(config.engine_url, limits=config.engine_limits, api_key=config.engine_api_key,
                                   logprobs_mode=config.logprobs_mode)
        self.mode_decision: ModeDecision | None = None
        if token_engine is None:
            token_engine, self.mode_decision = select_token_engine(config, self.client)
            register_mode_metric(self.metrics.registry, self.mode_decision)
        if isinstance(token_engine, ExactTokenEngine):
            register_exact_metrics(self.metrics.registry, token_engine)
        self.engine = token_engine
        self.persist = Persister()
        self.in_flight = 0  # admitted calls not yet answered (the persister inlines fsync when alone)
        self.flights: dict[str, set[Flight]] = {}  # session id -> its calls in flight (abandon them at session end)
        self.stopping = False  # the server is shutting down: calls in flight are cut off, new ones too (`shut_down`)

    # -- responses -------------------------------------------------------------------------------

    def error_response(self, dialect: Dialect, err: ProxyError, count: bool = True) -> Response:
        if count:
            self.metrics.errors.labels(err.kind).inc()
        headers = {"retry-after": str(int(err.retry_after))} if err.retry_after is not None else None
        return Response(orjson.dumps(dialect.error_body(err)), status_code=err.status,
                        media_type="application/json", headers=headers)

    async def read_body(self, scope: dict[str, Any], receive: Any) -> bytes:
        limit = self.config.max_body_bytes
        length = header(scope, b"content-length")
        if length and length.isdigit() and int(length) > limit:
            raise ProxyError("too_large", f"request body is {length} bytes; the limit is {limit} bytes")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect
                raise ProxyError("client_disconnect", "the client disconnected while sending the request body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ProxyError("too_large", f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def authenticate(self, scope: dict[str, Any]) -> Session:
        """The session whose secret the request carries (and whose /s/<id>/ prefix it used, if any)."""
        return self.sessions.authenticate(api_key(scope), scope.get(PATH_SESSION))

    async def admit(self, scope: dict[str, Any], receive: Any, dialect: Dialect,
                    path_model: str | None) -> tuple[Session, Conversation, Any, bytes]:
        session = self.authenticate(scope)
        raw = await self.read_body(scope, receive)
        if not raw.strip():
            raise ProxyError("invalid_request", "request body is empty; expected a JSON object")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ProxyError("invalid_request", f"malformed JSON in request body: {exc}") from None
        conv = dialect.parse(body, path_model)
        return session, conv, body, raw

    # -- the call pipeline -----------------------------------------------------------------------

    async def call(self, scope: dict[str, Any], receive: Any, dialect: Dialect, path_model: str | None = None,
                   stream: bool | None = None) -> Response:
        """One model call, answered with an ASGI response (a streamed one is an EventStream)."""
        received = time.time()
        try:
            session, conv, body, raw = await self.admit(scope, receive, dialect, path_model)
            if stream is not None:
                conv.stream = stream
            policy = await self.controls.admit()
        except ProxyError as err:
            self.metrics.calls.labels(dialect.name, str(err.status)).inc()
            return self.error_response(dialect, err)
        state = CallState(call_id=secrets.token_hex(12), session_id=session.session_id, dialect=dialect.name,
                          stream=conv.stream, received_at=received, policy_version=policy, requested_model=conv.model)
        request_ref = None
        if len(raw) > self.config.inline_body_bytes:
            request_ref = await asyncio.to_thread(spill_body, self.config.capture_dir, session.session_id, state.call_id, raw)
            body = None
        del raw
        head = RecordHead(state, conv=conv, request=body, request_ref=request_ref, headers=kept_headers(scope["headers"]),
                          mode=self.engine.mode, engine_url=self.config.engine_url)
        ctx = CallContext(session, dialect, conv, head, state)
        asyncio.get_running_loop().call_soon(precompute_head, head)
        if conv.stream:
            return EventStream(self, ctx)  # counts itself out of in_flight when done
        self.in_flight += 1
        flight = self._take_off(session, state)
        watcher = asyncio.get_running_loop().create_task(watch_disconnect(receive, flight))
        try:
            return await self._call_whole(ctx)
        except asyncio.CancelledError:
            self._abandoned(ctx, flight)
            if flight.reason is None or flight.task.uncancel() > 0:
                raise
            return self.error_response(dialect, state.error or ProxyError(flight.reason, ""), count=False)
        finally:
            self.in_flight -= 1
            watcher.cancel()
            self._land(flight)

    def _record(self, ctx: CallContext) -> bytes:
        """The call's capture-log line."""
        return encode_record_line(ctx.head, ctx.state, self.engine.splice_info(ctx.state.call_id))

    async def _persist(self, ctx: CallContext) -> None:
        """The call's record made durable in its session's log (before the answer's final byte)."""
        await self.persist(ctx.session, self._record(ctx), ctx.state.error is not None, alone=self.in_flight <= 1)

    def _take_off(self, session: Session, state: CallState) -> Flight:
        """Register the current task as a call in flight for its session."""
        task = asyncio.current_task()
        assert task is not None
        flight = Flight(task, state)
        self.flights.setdefault(session.session_id, set()).add(flight)
        if self.stopping:  # admitted while the proxy shuts down: cut off at its first wait, recorded like the others
            flight.reason = "proxy_shutdown"
            task.cancel()
        return flight

    def _land(self, flight: Flight) -> None:
        calls = self.flights.get(flight.state.session_id)
        if calls is not None:
            calls.discard(flight)
        flight.landed.set()

    def _abandoned(self, ctx: CallContext, flight: Flight) -> None:
        """Record a call cut off by its client or its session's end (if its record was not written yet).

        Written inline: the task is being cancelled, and an await could be cancelled again. Leaving the
        engine's generator (the caller's job) closes the engine request, which is what makes vLLM abort it."""
        state = ctx.state
        if state.done_at is not None:
            return
        # no reason: cancelled by the server itself (its graceful-shutdown timeout ran out)
        kind = flight.reason or ("proxy_shutdown" if self.stopping else "client_disconnect")
        state.error = ProxyError(kind, ABANDON_MESSAGES[kind])
        state.done_at = time.time()
        ctx.session.append_encoded(self._record(ctx), 1, True)
        ctx.session.abandoned += 1
        self._observe(ctx.dialect, state, str(state.error.status))
        self.metrics.abandoned.labels(ctx.dialect.name, kind).inc()
        if state.engine_sent_at is not None:
            self.metrics.engine_cancelled.inc()

    async def abandon(self, session_id: str, reason: str = "session_closed", wait_s: float = 5.0) -> int:
        """Cut off every call of a session still in flight and return once each is recorded: how many."""
        return await self._cut_off(list(self.flights.get(session_id, ())), reason, wait_s)

    async def shut_down(self, wait_s: float = 5.0) -> int:
        """Cut off every call in flight, of every session, and return once each is recorded: how many.

        Run when the server stops, before it waits for its connections to finish: a call still generating
        would otherwise hold the shutdown until the engine is done (or be killed unrecorded). Each is recorded
        as `proxy_shutdown` with what the engine had produced, its engine request closed (vLLM aborts it), and
        the harness, if still connected, gets its dialect's retryable 503. Calls admitted from now on too."""
        self.stopping = True
        return await self._cut_off([f for calls in self.flights.values() for f in calls], "proxy_shutdown", wait_s)

    @staticmethod
    async def _cut_off(flights: list[Flight], reason: str, wait_s: float) -> int:
        cut = [f for f in flights if f.reason is None and not f.closing and f.state.done_at is None]
        for flight in cut:
            flight.reason = reason
            flight.task.cancel()
        if flights:
            await asyncio.wait([asyncio.ensure_future(f.landed.wait()) for f in flights], timeout=wait_s)
        return len(cut)

    def _observe(self, dialect: Dialect, state: CallState, status: str) -> None:
        m = self.metrics
        m.calls.labels(dialect.name, status).inc()
        m.prompt_tokens.labels(dialect.name).inc(state.prompt_tokens)
        m.completion_tokens.labels(dialect.name).inc(state.completion_tokens)
        if state.first_token_at is not None:
            m.ttft.labels(dialect.name).observe(max(0.0, state.first_token_at - state.received_at))
        m.latency.labels(dialect.name).observe(max(0.0, (state.done_at or time.time()) - state.received_at))
        if state.error is not None:
            m.errors.labels(state.error.kind).inc()
            if state.error.limit is not None:
                m.engine_timeouts.labels(state.error.limit).inc()

    async def _call_whole(self, ctx: CallContext) -> Response:
        dialect, conv, state = ctx.dialect, ctx.conv, ctx.state
        try:
            # a cancellation (client gone, session closed) goes through the engine's generator and
            # closes its engine request on the way out
            async for _ in self.engine.generate(conv, state):
                pass
            payload = orjson.dumps(dialect.response(conv, state))
        except ProxyError as err:
            state.error = err
        except Exception as exc:  # a proxy bug must still leave a record and a well-formed answer
            state.error = ProxyError("internal", f"proxy error: {type(exc).__name__}: {exc}")
        state.done_at = time.time()
        await self._persist(ctx)
        if state.error is not None:
            self._observe(dialect, state, str(state.error.status))
            return self.error_response(dialect, state.error, count=False)
        # metrics are observed once the answer is on its way (the next loop turn), as for streams
        asyncio.get_running_loop().call_soon(self._observe, dialect, state, "200")
        return Response(payload, media_type="application/json")
