"""The capture proxy as an ASGI app: `create_app(ProxyConfig) -> FastAPI`.

The call pipeline is `pipeline.Proxy`, a streamed answer's transport `sse.EventStream`, the routes
`routes` (and `admin` for the runner's / operator's API); this module puts them together.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from tracefleet.proxy.admin import add_admin_routes
from tracefleet.proxy.config import ProxyConfig
from tracefleet.proxy.pipeline import PATH_SESSION, Proxy
from tracefleet.proxy.routes import GOOGLE_MODELS, add_routes
from tracefleet.proxy.token_engine import TokenEngine


def without_session_prefix(scope: dict[str, Any]) -> dict[str, Any]:
    """`/s/<id>/rest` → `/rest`, remembering the id; the harness may use the prefix as its base URL."""
    _, _, sid, *rest = scope["path"].split("/", 3)
    path = "/" + (rest[0] if rest else "")
    scope = dict(scope, path=path, raw_path=path.encode())
    scope[PATH_SESSION] = sid
    return scope


class SessionPrefix:
    """The session prefix (`without_session_prefix`) for every route FastAPI serves."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/s/"):
            scope = without_session_prefix(scope)
        await self.app(scope, receive, send)


class ProxyApp(FastAPI):
    """FastAPI, with the model-call routes (`generation_routes`) answered before its middleware stack.

    Every model call otherwise passed through eight ASGI layers (FastAPI's error, telemetry, body-limit,
    exception and exit-stack middlewares, the router, the route, its handler), each wrapping `send`
    again: measured on bench/proxy.py, ~60 µs of CPU per call, a third of what the proxy added over a
    bare relay. What those layers do for these routes is done by the endpoints themselves: they read
    the body under the proxy's own limit, answer every ProxyError in the caller's dialect, and record
    and answer an unexpected error as `internal`; anything that still escapes is uvicorn's 500, as it
    was ServerErrorMiddleware's. Other methods and paths (405s, 404s, probes, admin) go through FastAPI."""

    generation_routes: dict[str, Any]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            call_scope = without_session_prefix(scope) if scope["path"].startswith("/s/") else scope
            path = call_scope["path"]
            endpoint = self.generation_routes.get(path)
            if endpoint is None and path.startswith(GOOGLE_MODELS) and len(path) > len(GOOGLE_MODELS):
                endpoint = self.generation_routes[GOOGLE_MODELS]
                call_scope = dict(call_scope, path_params={"target": path[len(GOOGLE_MODELS):]})
            if endpoint is not None:
                await endpoint(call_scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(config: ProxyConfig, *, token_engine: TokenEngine | None = None) -> FastAPI:
    proxy = Proxy(config, token_engine)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        proxy.persist.close()
        await proxy.client.aclose()
        if proxy.guide is not None:
            await proxy.guide.aclose()
        proxy.sessions.close_all()

    extra: dict[str, Any] = {}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        extra["telemetry"] = {"tracing": False, "metrics": False, "logs": False}  # per-request spans cost µs we want back
    app = ProxyApp(title="tracefleet proxy", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None, **extra)
    app.state.proxy = proxy
    app.add_middleware(SessionPrefix)

    app.generation_routes = add_routes(app, proxy)
    add_admin_routes(app, proxy)
    return app
