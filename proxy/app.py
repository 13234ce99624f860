"""The capture proxy as an ASGI app: `create_app(ProxyConfig) -> FastAPI`.

Hot path per call: authenticate → read body (bounded) → dialect.parse → admit (pause bound) →
token engine → render (streamed as the engine produces) → fsync the capture record → final event.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException as StarletteHTTPException

from .canonical import Conversation
from .capture import Persister, RecordHead, encode_record_line, kept_headers, precompute_head, spill_body
from .config import ProxyConfig
from .controls import Controls
from .dialects import Dialect, StreamWriter
from .dialects.anthropic import Anthropic
from .dialects.google import Google
from .dialects.openai_chat import OpenAIChat
from .dialects.openai_responses import OpenAIResponses
from .engine_client import EngineClient
from .errors import ProxyError
from .metrics import ProxyMetrics
from .sessions import Session, SessionStore
from .exact.engine import ExactTokenEngine
from .exact.metrics import register_exact_metrics
from .mode import ModeDecision, register_mode_metric, select_token_engine
from .token_engine import CallState, TokenEngine

PATH_SESSION = "tracefleet.path_session"
CHAT, RESPONSES, ANTHROPIC, GOOGLE = OpenAIChat(), OpenAIResponses(), Anthropic(), Google()
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


ABANDON_MESSAGES = {
    "client_disconnect": "the client disconnected before the answer completed",
    "session_closed": "the session was closed while the call was in flight",
}


@dataclass(eq=False, slots=True)
class Flight:
    """A call in flight: the task answering it, so that a client's disconnect or its session's end can
    cut it off (`reason`), and `landed` once it is recorded and answered."""

    task: asyncio.Task[Any]
    state: CallState
    reason: str | None = None  # why it is being cut off: client_disconnect | session_closed
    closing: bool = False  # its final event is being sent: no longer cut off by a disconnect
    landed: asyncio.Event = field(default_factory=asyncio.Event)


async def watch_disconnect(receive: Any, flight: Flight) -> None:
    """Turn the client's disconnect into a cancellation of the call (its engine request with it).

    Once the request body is read, the server's `receive` returns only when the client goes away
    (or the answer is complete, when this watcher is no longer needed)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    if flight.reason is None and not flight.closing:
        flight.reason = "client_disconnect"
        flight.task.cancel()


def dialect_for_path(path: str) -> Dialect:
    if path.startswith("/v1/messages"):
        return ANTHROPIC
    if path.startswith("/v1beta"):
        return GOOGLE
    if path.startswith("/v1/responses"):
        return RESPONSES
    return CHAT


class SessionPrefix:
    """`/s/<id>/rest` → `/rest`, remembering the id; the harness may use the prefix as its base URL."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/s/"):
            _, _, sid, *rest = scope["path"].split("/", 3)
            path = "/" + (rest[0] if rest else "")
            scope = dict(scope, path=path, raw_path=path.encode())
            scope[PATH_SESSION] = sid
        await self.app(scope, receive, send)


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
        self.client = EngineClient(config.engine_url, timeout_s=config.engine_timeout_s,
                                   connect_timeout_s=config.engine_connect_timeout_s)
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
        ctx = (session, conv, head)
        asyncio.get_running_loop().call_soon(precompute_head, head)
        if conv.stream:
            return EventStream(self, dialect, state, ctx)  # counts itself out of in_flight when done
        self.in_flight += 1
        flight = self._take_off(session, state)
        watcher = asyncio.get_running_loop().create_task(watch_disconnect(receive, flight))
        try:
            return await self._call_whole(dialect, state, ctx)
        except asyncio.CancelledError:
            self._abandoned(dialect, state, ctx, flight)
            if flight.reason is None or flight.task.uncancel() > 0:
                raise
            return self.error_response(dialect, state.error or ProxyError(flight.reason, ""), count=False)
        finally:
            self.in_flight -= 1
            watcher.cancel()
            self._land(flight)

    def _record(self, state: CallState, ctx: tuple[Any, ...]) -> bytes:
        """The call's capture-log line."""
        return encode_record_line(ctx[2], state, self.engine.splice_info(state.call_id))

    async def _persist(self, state: CallState, ctx: tuple[Any, ...]) -> None:
        """The call's record made durable in its session's log (before the answer's final byte)."""
        await self.persist(ctx[0], self._record(state, ctx), state.error is not None, alone=self.in_flight <= 1)

    def _take_off(self, session: Session, state: CallState) -> Flight:
        """Register the current task as a call in flight for its session."""
        task = asyncio.current_task()
        assert task is not None
        flight = Flight(task, state)
        self.flights.setdefault(session.session_id, set()).add(flight)
        return flight

    def _land(self, flight: Flight) -> None:
        calls = self.flights.get(flight.state.session_id)
        if calls is not None:
            calls.discard(flight)
        flight.landed.set()

    def _abandoned(self, dialect: Dialect, state: CallState, ctx: tuple[Any, ...], flight: Flight) -> None:
        """Record a call cut off by its client or its session's end (if its record was not written yet).

        Written inline: the task is being cancelled, and an await could be cancelled again. Leaving the
        engine's generator (the caller's job) closes the engine request, which is what makes vLLM abort it."""
        if state.done_at is not None:
            return
        kind = flight.reason or "client_disconnect"
        state.error = ProxyError(kind, ABANDON_MESSAGES[kind])
        state.done_at = time.time()
        session: Session = ctx[0]
        session.append_encoded(self._record(state, ctx), 1, True)
        session.abandoned += 1
        self._observe(dialect, state, str(state.error.status))
        self.metrics.abandoned.labels(dialect.name, kind).inc()
        if state.engine_sent_at is not None:
            self.metrics.engine_cancelled.inc()

    async def abandon(self, session_id: str, reason: str = "session_closed", wait_s: float = 5.0) -> int:
        """Cut off every call of a session still in flight and return once each is recorded: how many."""
        flights = list(self.flights.get(session_id, ()))
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

    async def _call_whole(self, dialect: Dialect, state: CallState, ctx: tuple[Any, ...]) -> Response:
        conv = ctx[1]
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
        await self._persist(state, ctx)
        if state.error is not None:
            self._observe(dialect, state, str(state.error.status))
            return self.error_response(dialect, state.error, count=False)
        # metrics are observed once the answer is on its way (the next loop turn), as for streams
        asyncio.get_running_loop().call_soon(self._observe, dialect, state, "200")
        return Response(payload, media_type="application/json")


class EventStream(Response):
    """A streamed answer: the token engine's events become the dialect's SSE as they arrive.

    The engine's generator is iterated in the request's own task, and events that arrived in one
    read (a `("batch", ...)`) go out in one write. (A pump task + queue per call and Starlette's
    StreamingResponse, with its task group per response, cost ~0.3 ms of CPU per streamed call.)
    What the task group did is done here with less: a watcher task turns the client's disconnect
    into a cancellation, and a timer sends keep-alive pings while the engine is silent.

    An error before any output is a plain HTTP error in the dialect's shape; after that, an error
    event. Either way the capture record is fsync'd before the final event is sent.
    """

    media_type = "text/event-stream"

    def __init__(self, proxy: Proxy, dialect: Dialect, state: CallState, ctx: tuple[Any, ...]) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(_SSE_HEADERS)
        self.proxy, self.dialect, self.state, self.ctx = proxy, dialect, state, ctx
        self.writer: StreamWriter = dialect.writer(ctx[1], state)
        self._send: Any = None
        self._opened = False  # SSE headers sent
        self._started = False  # the dialect's opening event sent
        self._closing = False  # the final event is being sent: no more pings, a disconnect is no longer one
        self.flight: Flight | None = None
        self._last = 0.0  # loop time of the last write
        self._ping: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        proxy = self.proxy
        proxy.in_flight += 1
        loop = asyncio.get_running_loop()
        flight = self.flight = proxy._take_off(self.ctx[0], self.state)
        self._send = send
        self._last = loop.time()
        self._timer = loop.call_at(self._last + proxy.config.keepalive_s, self._tick)
        watcher = loop.create_task(watch_disconnect(receive, flight))
        events = proxy.engine.generate(self.ctx[1], self.state)
        try:
            await self._stream(events, scope, receive)
        except asyncio.CancelledError:
            # the harness went away, its session ended (or the server is stopping): the partial call is still recorded
            proxy._abandoned(self.dialect, self.state, self.ctx, flight)
            if flight.reason is None or flight.task.uncancel() > 0:
                raise
            if flight.reason != "client_disconnect":  # the harness is still there: tell it
                with contextlib.suppress(Exception):
                    await self._fail(self.state.error or ProxyError(flight.reason, ""), scope, receive)
        finally:
            proxy.in_flight -= 1
            self._closing = flight.closing = True
            self._timer.cancel()
            watcher.cancel()
            if self._ping is not None and not self._ping.done():
                self._ping.cancel()
            with contextlib.suppress(BaseException):
                await events.aclose()  # a stream left early (error, disconnect) closes its engine request
            proxy._land(flight)

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        keepalive = self.proxy.config.keepalive_s
        due = self._last + keepalive
        if loop.time() >= due - 0.001 and not self._closing and (self._ping is None or self._ping.done()):
            self._ping = loop.create_task(self._keepalive())
            due = loop.time() + keepalive
        self._timer = loop.call_at(due, self._tick)

    async def _keepalive(self) -> None:
        """Engine silence: open the stream (slow prefill) or ping; runs only while the main task waits."""
        try:
            if not self._opened:
                await self._open(b"")
            else:
                ping = self.writer.ping()
                if ping:
                    await self._send({"type": "http.response.body", "body": ping, "more_body": True})
            self._last = asyncio.get_running_loop().time()
        except Exception:  # noqa: BLE001 - the client is gone; the watcher reports it
            pass

    async def _open(self, body: bytes) -> None:
        self._opened = True
        if not self._started:
            self._started = True
            body = self.writer.start() + body
        await self._send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": True})

    async def _write(self, body: bytes, final: bool = False) -> None:
        if self._ping is not None and not self._ping.done():
            await self._ping  # never interleave with (or overtake) a keep-alive write
        if final:
            self._closing = True
            if self.flight is not None:
                self.flight.closing = True
        if not self._opened:
            if final:
                self._opened = True
                body = (b"" if self._started else self.writer.start()) + body
                self._started = True
                await self._send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            else:
                await self._open(body)
                self._last = asyncio.get_running_loop().time()
                return
        await self._send({"type": "http.response.body", "body": body, "more_body": not final})
        self._last = asyncio.get_running_loop().time()

    def _render(self, ev: Any, out: list[bytes]) -> None:
        kind, value = ev
        writer = self.writer
        if kind == "batch":
            for sub in value:
                self._render(sub, out)
            return
        if not self._started:
            self._started = True  # the engine may skip its opening event: open the message anyway
            out.append(writer.start())
            if kind == "start":
                return
        if kind == "text":
            out.append(writer.text(value))
        elif kind == "reasoning":
            out.append(writer.reasoning(value))
        elif kind == "tool_call":
            out.append(writer.tool_call(value))

    async def _stream(self, events: AsyncIterator[Any], scope: dict[str, Any], receive: Any) -> None:
        proxy, dialect, state = self.proxy, self.dialect, self.state
        out: list[bytes] = []
        try:
            async for ev in events:
                self._render(ev, out)
                if out:
                    await self._write(out[0] if len(out) == 1 else b"".join(out))
                    out.clear()
        except ProxyError as err:
            error = err
        except Exception as exc:  # a proxy bug must still leave a record and a well-formed answer
            error = ProxyError("internal", f"proxy error: {type(exc).__name__}: {exc}")
        else:
            state.done_at = time.time()
            await proxy._persist(state, self.ctx)
            try:
                await self._write(self.writer.end(), final=True)  # durable before the final event
            finally:
                proxy._observe(dialect, state, "200")  # off the answer's critical path
            return
        state.error = error
        state.done_at = time.time()
        await proxy._persist(state, self.ctx)
        proxy._observe(dialect, state, str(error.status))
        await self._fail(error, scope, receive)

    async def _fail(self, error: ProxyError, scope: dict[str, Any], receive: Any) -> None:
        """End the answer with `error`: a plain HTTP error before any output, else the dialect's error event."""
        if self._ping is not None and not self._ping.done():
            await self._ping
        if not self._opened:  # refused before any output
            self._closing = self._opened = True
            await self.proxy.error_response(self.dialect, error, count=False)(scope, receive, self._send)
            return
        await self._write(self.writer.error(error), final=True)


class Generate:
    """POST /v1/chat/completions, /v1/responses, /v1/messages: one dialect's model call."""

    def __init__(self, proxy: Proxy, dialect: Dialect) -> None:
        self.proxy, self.dialect = proxy, dialect

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        response = await self.proxy.call(scope, receive, self.dialect)
        await response(scope, receive, send)


class GoogleModelAction:
    """POST /v1beta/models/<model>:<action>: generateContent, streamGenerateContent, countTokens."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        proxy = self.proxy
        target = scope["path_params"]["target"]
        model_name, _, action = target.rpartition(":")
        response: Response
        if action in ("generateContent", "streamGenerateContent"):
            response = await proxy.call(scope, receive, GOOGLE, model_name, stream=action == "streamGenerateContent")
        elif action == "countTokens":
            try:
                _, conv, _, _ = await proxy.admit(scope, receive, GOOGLE, model_name)
                n = await proxy.engine.count_tokens(conv)
            except ProxyError as err:
                response = proxy.error_response(GOOGLE, err)
            else:
                response = Response(orjson.dumps({"totalTokens": n}), media_type="application/json")
        else:
            response = proxy.error_response(GOOGLE, ProxyError("not_found", f"unknown model action {action!r} in {target!r}"))
        await response(scope, receive, send)


def create_app(config: ProxyConfig, *, token_engine: TokenEngine | None = None) -> FastAPI:
    proxy = Proxy(config, token_engine)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        proxy.persist.close()
        await proxy.client.aclose()
        proxy.sessions.close_all()

    extra: dict[str, Any] = {}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        extra["telemetry"] = {"tracing": False, "metrics": False, "logs": False}  # per-request spans cost µs we want back
    app = FastAPI(title="tracefleet proxy", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None, **extra)
    app.state.proxy = proxy
    app.add_middleware(SessionPrefix)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        msg = f"unknown route: {request.method} {request.url.path}" if exc.status_code == 404 else \
            f"method {request.method} not allowed on {request.url.path}" if exc.status_code == 405 else str(exc.detail)
        return proxy.error_response(dialect_for_path(request.url.path), ProxyError(kind, msg, status=exc.status_code))

    @app.exception_handler(ProxyError)
    async def proxy_error(request: Request, exc: ProxyError) -> Response:
        return proxy.error_response(dialect_for_path(request.url.path), exc)

    # -- generation routes -----------------------------------------------------------------------
    # Plain ASGI endpoints on FastAPI's router: matched like any route (404s, 405s and the exception
    # handlers still apply), without the Request object and exception-wrapping layer FastAPI puts around
    # function endpoints on every model call. Registered first because the router tries routes in order.

    app.add_route("/v1/chat/completions", Generate(proxy, CHAT), methods=["POST"])
    app.add_route("/v1/responses", Generate(proxy, RESPONSES), methods=["POST"])
    app.add_route("/v1/messages", Generate(proxy, ANTHROPIC), methods=["POST"])
    app.add_route("/v1beta/models/{target:path}", GoogleModelAction(proxy), methods=["POST"])

    # -- probes ----------------------------------------------------------------------------------

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root() -> Response:
        return Response(b'{"status":"ok","service":"tracefleet-proxy"}', media_type="application/json")

    decision = proxy.mode_decision
    health_body = orjson.dumps({"status": "ok", "capture_mode": decision.as_dict() if decision else
                                {"mode": proxy.engine.mode, "reason": "token engine given by the caller"}})

    @app.get("/health")
    async def health() -> Response:
        return Response(health_body, media_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        m = proxy.metrics
        m.active_sessions.set(proxy.sessions.active_count())
        m.paused.set(1 if proxy.controls.paused else 0)
        m.policy_version.set(proxy.controls.policy_version)
        m.session_in_flight.clear()
        for sid, flights in proxy.flights.items():
            session = proxy.sessions.get(sid)
            if session is not None and session.active:
                m.session_in_flight.labels(sid).set(len(flights))
        return Response(m.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    # -- models ----------------------------------------------------------------------------------

    async def model_list(request: Request) -> list[str]:
        proxy.authenticate(request.scope)
        return [await proxy.engine.served_model()]

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        ids = await model_list(request)
        data = [{"id": i, "object": "model", "created": 0, "owned_by": "tracefleet", "type": "model",
                 "display_name": i, "created_at": "1970-01-01T00:00:00Z"} for i in ids]
        return Response(orjson.dumps({"object": "list", "data": data, "has_more": False,
                                      "first_id": ids[0], "last_id": ids[-1]}), media_type="application/json")

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> Response:
        await model_list(request)
        return Response(orjson.dumps({"id": model_id, "object": "model", "created": 0, "owned_by": "tracefleet",
                                      "type": "model", "display_name": model_id, "created_at": "1970-01-01T00:00:00Z"}),
                        media_type="application/json")

    @app.get("/v1beta/models")
    async def google_models(request: Request) -> Response:
        ids = await model_list(request)
        return Response(orjson.dumps({"models": [{"name": f"models/{i}", "displayName": i,
                                                  "supportedGenerationMethods": ["generateContent", "countTokens"]}
                                                 for i in ids]}), media_type="application/json")

    # -- dialects (the generation routes are registered first, above) ---------------------------

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        try:
            # count_tokens bodies carry no max_tokens
            proxy.authenticate(request.scope)
            raw = await proxy.read_body(request.scope, request.receive)
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise ProxyError("invalid_request", f"malformed JSON in request body: {exc}") from None
            conv = ANTHROPIC.parse(body, count_only=True)
            n = await proxy.engine.count_tokens(conv)
        except ProxyError as err:
            return proxy.error_response(ANTHROPIC, err)
        return Response(orjson.dumps({"input_tokens": n}), media_type="application/json")

    # -- admin -----------------------------------------------------------------------------------

    from .admin import add_admin_routes

    add_admin_routes(app, proxy)
    return app
