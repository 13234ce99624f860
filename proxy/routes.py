"""The proxy's HTTP routes: the generation endpoints of the four dialects (plain ASGI endpoints),
probes, metrics, model lists, token counting, and the error handlers that answer in the caller's dialect."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from tracefleet.proxy.dialects import DialectCodec
from tracefleet.proxy.dialects.anthropic import Anthropic
from tracefleet.proxy.dialects.google import Google
from tracefleet.proxy.dialects.openai_chat import OpenAIChat
from tracefleet.proxy.dialects.openai_responses import OpenAIResponses
from tracefleet.proxy.errors import ProxyError
from tracefleet.proxy.pipeline import Proxy

CHAT, RESPONSES, ANTHROPIC, GOOGLE = OpenAIChat(), OpenAIResponses(), Anthropic(), Google()
GOOGLE_MODELS = "/v1beta/models/"  # + <model>:<action>


def dialect_for_path(path: str) -> DialectCodec:
    if path.startswith("/v1/messages"):
        return ANTHROPIC
    if path.startswith("/v1beta"):
        return GOOGLE
    if path.startswith("/v1/responses"):
        return RESPONSES
    return CHAT


class Generate:
    """POST /v1/chat/completions, /v1/responses, /v1/messages: one dialect's model call."""

    def __init__(self, proxy: Proxy, dialect: DialectCodec) -> None:
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


def add_routes(app: FastAPI, proxy: Proxy) -> dict[str, Any]:
    """Every route but the admin API (`proxy.admin`), generation routes first. Returns the generation
    endpoints by path (the Google one under its prefix), for `app.ProxyApp` to answer directly."""
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

    generation: dict[str, Any] = {"/v1/chat/completions": Generate(proxy, CHAT),
                                  "/v1/responses": Generate(proxy, RESPONSES),
                                  "/v1/messages": Generate(proxy, ANTHROPIC),
                                  GOOGLE_MODELS: GoogleModelAction(proxy)}
    for path, endpoint in generation.items():
        app.add_route(path + "{target:path}" if path == GOOGLE_MODELS else path, endpoint, methods=["POST"])

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
        for sid, calls in proxy.flights.per_session():
            session = proxy.sessions.get(sid)
            if session is not None and session.active:
                m.session_in_flight.labels(sid).set(calls)
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

    return generation
