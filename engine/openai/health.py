"""GET /health (200 once the model is loaded: the app exists only then) and GET /version."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from tracefleet.engine.protocol import ENGINE_VERSION, HEALTH, VERSION

router = APIRouter()


@router.get(HEALTH)
async def health() -> Response:
    return Response(status_code=200)


@router.get(VERSION)
async def show_version() -> dict[str, str]:
    return {"version": ENGINE_VERSION}
