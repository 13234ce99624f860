"""Admin API (runner / operator): sessions, pause/resume, policy version. Bearer admin token."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from .errors import ProxyError

if TYPE_CHECKING:
    from .pipeline import Proxy


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def add_admin_routes(app: FastAPI, proxy: Proxy) -> None:
    token = proxy.config.admin_token

    def check(request: Request) -> None:
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not given:
            raise ProxyError("authentication", "admin endpoints need Authorization: Bearer <admin-token>")
        if not hmac.compare_digest(given, token):
            raise ProxyError("permission", "wrong admin token")

    async def body_of(request: Request) -> dict[str, Any]:
        raw = await proxy.read_body(request.scope, request.receive)
        if not raw.strip():
            return {}
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ProxyError("invalid_request", f"malformed JSON in request body: {exc}") from None
        if not isinstance(data, dict):
            raise ProxyError("invalid_request", "request body must be a JSON object")
        return data

    def session_or_404(session_id: str):  # -> Session
        session = proxy.sessions.get(session_id)
        if session is None:
            raise ProxyError("not_found", f"no session {session_id!r}")
        return session

    @app.post("/admin/sessions")
    async def create_session(request: Request) -> Response:
        check(request)
        data = await body_of(request)
        sid, meta, secret = data.get("session_id"), data.get("metadata"), data.get("secret")
        if sid is not None and not isinstance(sid, str):
            raise ProxyError("invalid_request", "'session_id' must be a string", param="session_id")
        if meta is not None and not isinstance(meta, dict):
            raise ProxyError("invalid_request", "'metadata' must be an object", param="metadata")
        if secret is not None and (not isinstance(secret, str) or len(secret) < 16):
            raise ProxyError("invalid_request", "'secret' must be a string of at least 16 characters", param="secret")
        session = proxy.sessions.create(sid, secret, meta)
        proxy.metrics.active_sessions.set(proxy.sessions.active_count())
        return _json({**session.info(), "secret": session.secret, "base_path": f"/s/{session.session_id}"}, 201)

    @app.get("/admin/sessions/{session_id}")
    async def get_session(request: Request, session_id: str) -> Response:
        check(request)
        return _json(session_or_404(session_id).info())

    @app.delete("/admin/sessions/{session_id}")
    async def close_session(request: Request, session_id: str) -> Response:
        check(request)
        session = session_or_404(session_id)
        # no new calls; the ones in flight are cut off (engine requests cancelled) and recorded before the log is sealed
        session.active = False
        await proxy.abandon(session_id)
        session.close()
        proxy.flights.pop(session_id, None)
        proxy.metrics.active_sessions.set(proxy.sessions.active_count())
        return _json(session.info())

    @app.post("/admin/pause")
    async def pause(request: Request) -> Response:
        check(request)
        data = await body_of(request)
        wait = data.get("max_wait_s")
        if wait is not None and (isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0):
            raise ProxyError("invalid_request", "'max_wait_s' must be a non-negative number", param="max_wait_s")
        proxy.controls.pause(wait)
        proxy.metrics.paused.set(1)
        return _json(proxy.controls.state())

    @app.post("/admin/resume")
    async def resume(request: Request) -> Response:
        check(request)
        proxy.controls.resume()
        proxy.metrics.paused.set(0)
        return _json(proxy.controls.state())

    @app.post("/admin/policy-version")
    async def policy_version(request: Request) -> Response:
        check(request)
        data = await body_of(request)
        version = data.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ProxyError("invalid_request", "'version' must be a non-negative integer", param="version")
        proxy.controls.policy_version = version
        proxy.metrics.policy_version.set(version)
        return _json(proxy.controls.state())

    @app.get("/admin/state")
    async def state(request: Request) -> Response:
        check(request)
        return _json({**proxy.controls.state(), "active_sessions": proxy.sessions.active_count()})
