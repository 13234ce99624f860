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
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .canonical import Conversation
from .capture import Persister, build_record, kept_headers, spill_body
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
_DONE = object()
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


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


def api_key(request: Request) -> str | None:
    h = request.headers
    auth = h.get("authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return h.get("x-api-key") or h.get("x-goog-api-key") or request.query_params.get("key")


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

    # -- responses -------------------------------------------------------------------------------

    def error_response(self, dialect: Dialect, err: ProxyError, count: bool = True) -> Response:
        if count:
            self.metrics.errors.labels(err.kind).inc()
        headers = {"retry-after": str(int(err.retry_after))} if err.retry_after is not None else None
        return Response(orjson.dumps(dialect.error_body(err)), status_code=err.status,
                        media_type="application/json", headers=headers)

    async def read_body(self, request: Request) -> bytes:
        limit = self.config.max_body_bytes
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit:
            raise ProxyError("too_large", f"request body is {length} bytes; the limit is {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ProxyError("too_large", f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def admit(self, request: Request, dialect: Dialect, path_model: str | None) -> tuple[Session, Conversation, Any, bytes]:
        session = self.sessions.authenticate(api_key(request), request.scope.get(PATH_SESSION))
        raw = await self.read_body(request)
        if not raw.strip():
            raise ProxyError("invalid_request", "request body is empty; expected a JSON object")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ProxyError("invalid_request", f"malformed JSON in request body: {exc}") from None
        conv = dialect.parse(body, path_model)
        return session, conv, body, raw

    # -- the call pipeline -----------------------------------------------------------------------

    async def call(self, request: Request, dialect: Dialect, path_model: str | None = None,
                   stream: bool | None = None) -> Response:
        received = time.time()
        try:
            session, conv, body, raw = await self.admit(request, dialect, path_model)
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
        ctx = (session, conv, body, request_ref, kept_headers(request.headers))
        if not conv.stream:
            return await self._call_whole(dialect, state, ctx)
        return await self._call_stream(dialect, state, ctx)

    def _record(self, state: CallState, ctx: tuple[Any, ...]):  # -> CaptureRecord
        _, conv, body, ref, headers = ctx
        record = build_record(state, conv=conv, request=body, request_ref=ref, headers=headers,
                              mode=self.engine.mode, engine_url=self.config.engine_url)
        record.splice = self.engine.splice_info(state.call_id)
        return record

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
        session, conv = ctx[0], ctx[1]
        try:
            async for _ in self.engine.generate(conv, state):
                pass
            payload = orjson.dumps(dialect.response(conv, state))
        except ProxyError as err:
            state.error = err
        except Exception as exc:  # a proxy bug must still leave a record and a well-formed answer
            state.error = ProxyError("internal", f"proxy error: {type(exc).__name__}: {exc}")
        state.done_at = time.time()
        await self.persist(session, self._record(state, ctx))
        if state.error is not None:
            self._observe(dialect, state, str(state.error.status))
            return self.error_response(dialect, state.error, count=False)
        self._observe(dialect, state, "200")
        return Response(payload, media_type="application/json")

    async def _call_stream(self, dialect: Dialect, state: CallState, ctx: tuple[Any, ...]) -> Response:
        session, conv = ctx[0], ctx[1]
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for ev in self.engine.generate(conv, state):
                    queue.put_nowait(ev)
                queue.put_nowait(_DONE)
            except ProxyError as err:
                queue.put_nowait(err)
            except Exception as exc:
                queue.put_nowait(ProxyError("internal", f"proxy error: {type(exc).__name__}: {exc}"))

        task = asyncio.create_task(pump())
        try:
            async with asyncio.timeout(self.config.keepalive_s):
                first = await queue.get()
        except TimeoutError:
            first = None  # slow prefill: open the stream now and keep it alive with pings
        if isinstance(first, ProxyError):  # refused before any output: a plain HTTP error
            state.error = first
            state.done_at = time.time()
            await self.persist(session, self._record(state, ctx))
            self._observe(dialect, state, str(first.status))
            return self.error_response(dialect, first, count=False)
        writer = dialect.writer(conv, state)
        return StreamingResponse(self._sse(dialect, state, ctx, writer, queue, task, first),
                                 media_type="text/event-stream", headers=_SSE_HEADERS)

    async def _sse(self, dialect: Dialect, state: CallState, ctx: tuple[Any, ...], writer: StreamWriter,
                   queue: asyncio.Queue[Any], task: asyncio.Task[None], first: Any) -> AsyncIterator[bytes]:
        session = ctx[0]
        keepalive = self.config.keepalive_s
        started = False
        pending = [first] if first is not None else []
        if first is None:
            started = True
            yield writer.start()
        try:
            while True:
                if not pending:
                    try:
                        async with asyncio.timeout(keepalive):
                            pending.append(await queue.get())
                    except TimeoutError:
                        ping = writer.ping()
                        if ping:
                            yield ping
                        continue
                while not queue.empty():  # coalesce what is already here into one write
                    pending.append(queue.get_nowait())
                out = []
                finished = False
                for ev in pending:
                    if not started and not isinstance(ev, ProxyError) and (ev is _DONE or ev[0] != "start"):
                        started = True  # the engine skipped its opening chunk: open the message anyway
                        out.append(writer.start())
                    if ev is _DONE:
                        finished = True
                        break
                    if isinstance(ev, ProxyError):
                        raise ev
                    kind, value = ev
                    if kind == "text":
                        out.append(writer.text(value))
                    elif kind == "reasoning":
                        out.append(writer.reasoning(value))
                    elif kind == "tool_call":
                        out.append(writer.tool_call(value))
                    elif kind == "start" and not started:
                        started = True
                        out.append(writer.start())
                pending.clear()
                if out:
                    yield b"".join(out)
                if finished:
                    break
            state.done_at = time.time()
            await self.persist(session, self._record(state, ctx))  # durable before the final event
            self._observe(dialect, state, "200")
            yield writer.end()
        except ProxyError as err:
            state.error = err
            state.done_at = time.time()
            await self.persist(session, self._record(state, ctx))
            self._observe(dialect, state, str(err.status))
            yield writer.error(err)
        except BaseException:
            # the harness went away (cancellation) or a bug: the partial call is still recorded
            if state.done_at is None:
                state.error = ProxyError("client_disconnect", "the client disconnected before the answer completed")
                state.done_at = time.time()
                session.append(self._record(state, ctx))
                self._observe(dialect, state, "499")
            raise
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


def create_app(config: ProxyConfig, *, token_engine: TokenEngine | None = None) -> FastAPI:
    proxy = Proxy(config, token_engine)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
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
        return Response(m.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    # -- models ----------------------------------------------------------------------------------

    async def model_list(request: Request) -> list[str]:
        proxy.sessions.authenticate(api_key(request), request.scope.get(PATH_SESSION))
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

    # -- dialects --------------------------------------------------------------------------------

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await proxy.call(request, CHAT)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await proxy.call(request, RESPONSES)

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await proxy.call(request, ANTHROPIC)

    async def count(request: Request, dialect: Dialect, path_model: str | None) -> int:
        _, conv, _, _ = await proxy.admit(request, dialect, path_model)
        return await proxy.engine.count_tokens(conv)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        try:
            # count_tokens bodies carry no max_tokens
            session = proxy.sessions.authenticate(api_key(request), request.scope.get(PATH_SESSION))
            del session
            raw = await proxy.read_body(request)
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise ProxyError("invalid_request", f"malformed JSON in request body: {exc}") from None
            conv = ANTHROPIC.parse(body, count_only=True)
            n = await proxy.engine.count_tokens(conv)
        except ProxyError as err:
            return proxy.error_response(ANTHROPIC, err)
        return Response(orjson.dumps({"input_tokens": n}), media_type="application/json")

    @app.post("/v1beta/models/{target:path}")
    async def google(request: Request, target: str) -> Response:
        model_name, _, action = target.rpartition(":")
        if action == "generateContent":
            return await proxy.call(request, GOOGLE, model_name, stream=False)
        if action == "streamGenerateContent":
            return await proxy.call(request, GOOGLE, model_name, stream=True)
        if action == "countTokens":
            try:
                n = await count(request, GOOGLE, model_name)
            except ProxyError as err:
                return proxy.error_response(GOOGLE, err)
            return Response(orjson.dumps({"totalTokens": n}), media_type="application/json")
        return proxy.error_response(GOOGLE, ProxyError("not_found", f"unknown model action {action!r} in {target!r}"))

    # -- admin -----------------------------------------------------------------------------------

    from .admin import add_admin_routes

    add_admin_routes(app, proxy)
    return app
