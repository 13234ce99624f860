"""Admin API (runner / operator): sessions, pause/resume, policy version. Bearer admin token.

The messages are `tracefleet.contract.proxy_admin`'s, as its client (`tracefleet.runner.proxy_admin`) reads
them; a body that does not fit is refused in the proxy's error shape, naming the field."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, TypeVar

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from tracefleet.contract.proxy_admin import (AdminPath, ControlsState, CreateSession, Pause, ProxyState,
                                             RegisteredSession, SetPolicyVersion)
from tracefleet.proxy.errors import ProxyError
from tracefleet.proxy.sessions import Session

if TYPE_CHECKING:
    from tracefleet.proxy.pipeline import Proxy

M = TypeVar("M", bound=BaseModel)


def _json(answer: BaseModel, status: int = 200) -> Response:
    return Response(answer.model_dump_json().encode(), status_code=status, media_type="application/json")


def _invalid(exc: ValidationError) -> ProxyError:
    """The first problem, as one line naming the field (the proxy's `param`)."""
    err = exc.errors()[0]
    field = str(err["loc"][0]) if err["loc"] else None
    message = f"'{field}': {err['msg']}" if field else str(err["msg"])
    return ProxyError("invalid_request", message, param=field)


def add_admin_routes(app: FastAPI, proxy: Proxy) -> None:
    token = proxy.config.admin_token

    def check(request: Request) -> None:
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not given:
            raise ProxyError("authentication", "admin endpoints need Authorization: Bearer <admin-token>")
        if not hmac.compare_digest(given, token):
            raise ProxyError("permission", "wrong admin token")

    async def body_as(request: Request, model: type[M]) -> M:
        raw = await proxy.read_body(request.scope, request.receive)
        try:
            data = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError as exc:
            raise ProxyError("invalid_request", f"malformed JSON in request body: {exc}") from None
        if not isinstance(data, dict):
            raise ProxyError("invalid_request", "request body must be a JSON object")
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise _invalid(exc) from None

    def session_or_404(session_id: str) -> Session:
        session = proxy.sessions.get(session_id)
        if session is None:
            raise ProxyError("not_found", f"no session {session_id!r}")
        return session

    def controls() -> ControlsState:
        return ControlsState.model_validate(proxy.controls.state())

    @app.post(AdminPath.SESSIONS)
    async def create_session(request: Request) -> Response:
        check(request)
        body = await body_as(request, CreateSession)
        if body.guided_calls:
            proxy.check_guide()
        session = proxy.sessions.create(body.session_id, body.secret, body.metadata, body.guided_calls)
        proxy.metrics.active_sessions.set(proxy.sessions.active_count())
        registered = RegisteredSession(**session.info().model_dump(), secret=session.secret,
                                       base_path=f"/s/{session.session_id}")
        return _json(registered, 201)

    @app.get(AdminPath.session("{session_id}"))
    async def get_session(request: Request, session_id: str) -> Response:
        check(request)
        return _json(session_or_404(session_id).info())

    @app.delete(AdminPath.session("{session_id}"))
    async def close_session(request: Request, session_id: str) -> Response:
        check(request)
        session = session_or_404(session_id)
        # no new calls; the ones in flight are cut off (engine requests cancelled) and recorded before the log is sealed
        session.active = False
        await proxy.flights.abandon(session_id)
        session.close()
        proxy.flights.forget(session_id)
        proxy.metrics.active_sessions.set(proxy.sessions.active_count())
        return _json(session.info())

    @app.post(AdminPath.PAUSE)
    async def pause(request: Request) -> Response:
        check(request)
        body = await body_as(request, Pause)
        proxy.controls.pause(body.max_wait_s)
        proxy.metrics.paused.set(1)
        return _json(controls())

    @app.post(AdminPath.RESUME)
    async def resume(request: Request) -> Response:
        check(request)
        proxy.controls.resume()
        proxy.metrics.paused.set(0)
        return _json(controls())

    @app.post(AdminPath.POLICY_VERSION)
    async def policy_version(request: Request) -> Response:
        check(request)
        body = await body_as(request, SetPolicyVersion)
        proxy.controls.policy_version = body.version
        proxy.metrics.policy_version.set(body.version)
        return _json(controls())

    @app.get(AdminPath.STATE)
    async def state(request: Request) -> Response:
        check(request)
        return _json(ProxyState(**controls().model_dump(), active_sessions=proxy.sessions.active_count()))
