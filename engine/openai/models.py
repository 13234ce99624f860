"""GET /v1/models: the served model names, with vLLM's `root` and `max_model_len`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from tracefleet.engine.openai.serving import EngineServing, engine_of
from tracefleet.engine.protocol import MODELS

router = APIRouter()


@router.get(MODELS)
async def show_available_models(request: Request) -> dict[str, Any]:
    return model_list(engine_of(request))


def model_list(engine: EngineServing) -> dict[str, Any]:
    created, max_len = engine.created, engine.backend.max_model_len
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": created, "owned_by": "tracefleet", "root": engine.root or name,
         "parent": None, "max_model_len": max_len,
         # what its logprobs are, where the backend says (vLLM's card does not: tracefleet.proxy.token_engine)
         **({"logprobs_mode": mode} if (mode := getattr(engine.backend, "logprobs_mode", None)) else {}),
         "permission": [
             {"id": f"modelperm-{name}", "object": "model_permission", "created": created,
              "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
              "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
              "organization": "*", "group": None, "is_blocking": False}]}
        for name in engine.names]}
