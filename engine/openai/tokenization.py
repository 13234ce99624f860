"""POST /tokenize and POST /detokenize (vLLM's: a prompt or chat messages, the template applied)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from tracefleet.engine.openai.serving import engine_of, parse_body
from tracefleet.engine.protocol import DETOKENIZE, TOKENIZE, DetokenizeRequest, EngineError, TokenizeRequest

router = APIRouter()


@router.post(TOKENIZE)
async def tokenize(request: Request) -> dict[str, Any]:
    engine, body = engine_of(request), await parse_body(request, TokenizeRequest)
    engine.check_model(body.model)
    tok = engine.backend.tokenizer
    if body.messages is not None:
        text = engine.render(body.messages, body.tools, body.add_generation_prompt, body.continue_final_message,
                             body.chat_template_kwargs)
        ids = tok.encode(text, add_special_tokens=bool(body.add_special_tokens))
    elif body.prompt is not None:
        ids = tok.encode(body.prompt, add_special_tokens=body.add_special_tokens is not False)
    else:
        raise EngineError("Either prompt or messages is required", param="prompt")
    return {"count": len(ids), "max_model_len": engine.backend.max_model_len, "tokens": ids,
            "token_strs": [tok.token_text(i) for i in ids] if body.return_token_strs else None}


@router.post(DETOKENIZE)
async def detokenize(request: Request) -> dict[str, Any]:
    engine, body = engine_of(request), await parse_body(request, DetokenizeRequest)
    engine.check_model(body.model)
    if body.tokens:
        engine.check_prompt_ids(body.tokens)
    return {"prompt": engine.backend.tokenizer.decode(body.tokens, skip_special_tokens=False)}
