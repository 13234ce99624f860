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
from tracefleet.proxy.routes import add_routes
from tracefleet.proxy.token_engine import TokenEngine


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

    add_routes(app, proxy)
    add_admin_routes(app, proxy)
    return app
