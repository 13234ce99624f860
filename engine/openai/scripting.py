"""Test and bench controls, absent for a real model served plainly: the scripted backend's script
(GET/PUT /scripted/script) and a real model's forced next replies (GET/PUT /forced/replies, teacher
forcing; see LlamaBackend)."""

from __future__ import annotations

import collections
from typing import Any

from fastapi import APIRouter, FastAPI, Request

from tracefleet.engine.backend import Backend
from tracefleet.engine.openai.serving import parse_body
from tracefleet.engine.protocol import FORCED_REPLIES, SCRIPTED_SCRIPT, ForcedReplies


def add_control_routes(app: FastAPI, backend: Backend) -> None:
    """The controls `backend` has, if any."""
    router = APIRouter()
    if getattr(backend, "script", None) is not None:
        from tracefleet.engine.scripted import Script

        @router.get(SCRIPTED_SCRIPT)
        async def get_script() -> dict[str, Any]:
            return backend.script.model_dump()  # type: ignore[attr-defined]

        @router.put(SCRIPTED_SCRIPT)
        async def put_script(request: Request) -> dict[str, Any]:
            backend.script = await parse_body(request, Script)  # type: ignore[attr-defined]
            return backend.script.model_dump()  # type: ignore[attr-defined]

    if isinstance(getattr(backend, "forced_replies", None), collections.deque):
        @router.get(FORCED_REPLIES)
        async def get_forced() -> dict[str, Any]:
            return {"replies": list(backend.forced_replies)}  # type: ignore[attr-defined]

        @router.put(FORCED_REPLIES)
        async def put_forced(request: Request) -> dict[str, Any]:
            body = await parse_body(request, ForcedReplies)
            backend.forced_replies.clear()  # type: ignore[attr-defined]
            backend.forced_replies.extend(body.replies)  # type: ignore[attr-defined]
            return {"replies": body.replies}

    app.include_router(router)
