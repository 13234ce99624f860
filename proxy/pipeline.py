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

from tracefleet.proxy.call import CallContext, Flight, Flights, call_error
from tracefleet.proxy.canonical import Conversation
from tracefleet.proxy.recording import Persister, RecordHead, kept_headers, precompute_head, spill_body
from tracefleet.proxy.config import ProxyConfig
from tracefleet.proxy.controls import Controls
from tracefleet.proxy.dialects import DialectCodec
from tracefleet.proxy.engine_client import EngineClient
from tracefleet.proxy.errors import ProxyError
from tracefleet.proxy.exact.engine import ExactTokenEngine
from tracefleet.proxy.exact.metrics import register_exact_metrics
from tracefleet.proxy.metrics import ProxyMetrics
from tracefleet.proxy.mode import ModeDecision, register_mode_metric, select_token_engine
from tracefleet.proxy.sessions import Session, SessionStore
from tracefleet.proxy.sse import EventStream
from tracefleet.proxy.token_engine import CallState, TokenEngine
from tracefleet.proxy.versions import EngineVersions, TimedTokens

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
        # the guide (ProxyConfig.guide_url): answers a guided session's first calls; exact mode only, where the proxy
        # renders every prompt itself, so the policy's next prompt holds the guide's tokens as sent
        self.guide = EngineClient(config.guide_url, limits=config.engine_limits) if config.guide_url else None
        if self.guide is not None and isinstance(token_engine, ExactTokenEngine):
            token_engine.guide = self.guide
        self.versions = EngineVersions(self.client)  # which weights sampled each token (tracefleet.proxy.versions)
        self.persist = Persister()
        self.flights = Flights(token_engine, self.persist, self.metrics, self.versions)

    # -- responses -------------------------------------------------------------------------------

    def error_response(self, dialect: DialectCodec, err: ProxyError, count: bool = True) -> Response:
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

    def check_guide(self) -> None:
        """Refuse a guided session this proxy cannot guide."""
        if self.guide is None:
            raise ProxyError("invalid_request", "guided_calls: this proxy has no guide engine (its guide_url is unset)",
                             param="guided_calls")
        if not isinstance(self.engine, ExactTokenEngine):
            raise ProxyError("invalid_request", f"guided_calls: a guided session needs exact capture mode, this proxy "
                             f"runs in {self.engine.mode} mode (the engine would re-render the guide's turns)",
                             param="guided_calls")

    def authenticate(self, scope: dict[str, Any]) -> Session:
        """The session whose secret the request carries (and whose /s/<id>/ prefix it used, if any)."""
        return self.sessions.authenticate(api_key(scope), scope.get(PATH_SESSION))

    async def admit(self, scope: dict[str, Any], receive: Any, dialect: DialectCodec,
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

    async def call(self, scope: dict[str, Any], receive: Any, dialect: DialectCodec, path_model: str | None = None,
                   stream: bool | None = None) -> Response:
        """One model call, answered with an ASGI response (a streamed one is an EventStream)."""
        received = time.time()
        try:
            session, conv, body, raw = await self.admit(scope, receive, dialect, path_model)
            if stream is not None:
                conv.stream = stream
            policy = self.versions.current(await self.controls.admit())
        except ProxyError as err:
            self.metrics.calls.labels(dialect.name, str(err.status)).inc()
            return self.error_response(dialect, err)
        state = CallState(call_id=secrets.token_hex(12), session_id=session.session_id, dialect=dialect.name,
                          stream=conv.stream, received_at=received, policy_version=policy, requested_model=conv.model,
                          completion_ids=TimedTokens(), guided=session.admit())
        request_ref = None
        if len(raw) > self.config.inline_body_bytes:
            request_ref = await asyncio.to_thread(spill_body, self.config.capture_dir, session.session_id, state.call_id, raw)
            body = None
        del raw
        head = RecordHead(state, conv=conv, request=body, request_ref=request_ref, headers=kept_headers(scope["headers"]),
                          mode=self.engine.mode,
                          engine_url=self.config.guide_url if state.guided else self.config.engine_url)
        ctx = CallContext(session, dialect, conv, head, state)
        asyncio.get_running_loop().call_soon(precompute_head, head)
        if conv.stream:
            return EventStream(self, ctx)
        flight = self.flights.take_off(ctx, receive)
        async with flight:
            return await self._answer_whole(flight)
        # cut off (client gone, session closed, proxy stopping): recorded; answered if anyone still listens
        return self.error_response(dialect, flight.error, count=False)

    async def shut_down(self, wait_s: float = 5.0) -> int:
        """Cut off every call in flight, of every session, and return once each is recorded: how many.

        Run when the server stops, before it waits for its connections to finish: a call still generating
        would otherwise hold the shutdown until the engine is done (or be killed unrecorded). Each is recorded
        as `proxy_shutdown` with what the engine had produced, its engine request closed (vLLM aborts it), and
        the harness, if still connected, gets its dialect's retryable 503. Calls admitted from now on too."""
        return await self.flights.shut_down(wait_s)

    async def _answer_whole(self, flight: Flight) -> Response:
        ctx = flight.ctx
        dialect = ctx.dialect
        error: ProxyError | None = None
        try:
            # a cut-off goes through the engine's generator and closes its engine request on the way out
            async for _ in flight.events:
                pass
            payload = orjson.dumps(dialect.response(ctx.conv, ctx.state))
        except Exception as exc:
            error = call_error(exc)
        await flight.record(error)
        if error is not None:
            flight.observe()
            return self.error_response(dialect, error, count=False)
        # metrics are observed once the answer is on its way (the next loop turn), as for streams
        asyncio.get_running_loop().call_soon(flight.observe)
        return Response(payload, media_type="application/json")
