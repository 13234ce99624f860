"""The engine's HTTP server: the subset of vLLM's OpenAI-compatible API that tracefleet uses.

`create_app(backend)` serves any `Backend` (llama.cpp on CPU, or the scripted one for harness tests), one
router per endpoint (`tracefleet.engine.openai`, laid out as vLLM's `entrypoints/openai`): GET /health,
GET /version, GET /metrics, GET /v1/models, POST /tokenize, POST /detokenize, POST /v1/completions (text or
token-id prompt) and POST /v1/chat/completions (chat template applied here, hermes tool calls parsed here),
streaming or not, with vLLM's `return_token_ids` (prompt_token_ids + per-choice token_ids; in streams, the
first chunk carries the prompt ids and each chunk the ids it adds) and OpenAI-shaped logprobs.

Every sampled token is delivered in exactly one chunk, even when its text is held back (a possible
tool-call tag or stop string): such chunks carry token ids and logprobs with an empty delta.
"""

from __future__ import annotations

from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from tracefleet.engine.backend import Backend
from tracefleet.engine.openai import chat_completion, completion, health, metrics, models, tokenization
from tracefleet.engine.openai.scripting import add_control_routes
from tracefleet.engine.openai.serving import EngineServing
from tracefleet.engine.protocol import ENGINE_VERSION, EngineError

ROUTERS = (health.router, metrics.router, models.router, tokenization.router, chat_completion.router,
           completion.router)


def create_app(backend: Backend, *, served_model_names: list[str] | None = None,
               default_max_tokens: int | None = None, clamp_max_tokens: bool = False,
               model_root: str | None = None) -> FastAPI:
    """The engine app for one backend. `default_max_tokens` caps replies that give no max_tokens
    (vLLM would allow the whole remaining context; a CPU model should not spend minutes on it).
    `clamp_max_tokens` shortens a max_tokens that does not fit the context instead of answering 400
    (vLLM answers 400; real harnesses ask for 32k-token replies that a 4k CPU context cannot hold)."""
    app = FastAPI(title="tracefleet engine", version=ENGINE_VERSION, docs_url=None, redoc_url=None)
    app.state.engine = EngineServing(backend, served_model_names, default_max_tokens, clamp_max_tokens, model_root)

    @app.exception_handler(EngineError)
    async def _engine_error(_: Request, exc: EngineError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors():
            loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
            parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
        return JSONResponse(EngineError("; ".join(parts) or "invalid request").body(), status_code=400)

    for router in ROUTERS:
        app.include_router(router)
    add_control_routes(app, backend)
    return app


AppFactory = Callable[[Backend], FastAPI]
