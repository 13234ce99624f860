"""POST /v1/completions: a text or token-id prompt (one per request), whole or streamed, with vLLM's
`return_token_ids` (the first chunk carries the prompt ids) and OpenAI's completion logprobs."""

from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from tracefleet.engine.backend import GenerationRequest
from tracefleet.engine.openai.serving import (SSE_DONE, SYSTEM_FINGERPRINT, EngineServing, Generation, Step, engine_of,
                                              parse_body, sse, stop_strings, until_disconnect)
from tracefleet.engine.protocol import COMPLETIONS, CompletionRequest, EngineError

router = APIRouter()


@router.post(COMPLETIONS)
async def create_completion(request: Request) -> Response:
    serving = ServingCompletion(engine_of(request))
    return await until_disconnect(request, serving.completions(await parse_body(request, CompletionRequest)))


class ServingCompletion:
    def __init__(self, engine: EngineServing) -> None:
        self.engine = engine

    def logprobs(self, steps: list[Step], top: int, offset: int) -> dict[str, Any]:
        token_text = self.engine.token_text
        tokens, lps, tops, offsets = [], [], [], []
        pos = offset
        for st in steps:
            text = token_text(st.token.token_id)
            tokens.append(text)
            lps.append(st.token.logprob)
            alts = {token_text(i): lp for i, lp in st.token.top_logprobs[:top]} if top else {}
            alts.setdefault(text, st.token.logprob)
            tops.append(alts)
            offsets.append(pos)
            pos += len(st.text)
        return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": tops}

    def prompt_ids(self, body: CompletionRequest) -> list[int]:
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise EngineError("Only one prompt per request is supported by the tracefleet engine",
                                  param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.engine.backend.tokenizer.encode(prompt, add_special_tokens=body.add_special_tokens)
        else:
            ids = list(prompt)  # type: ignore[arg-type]
        self.engine.check_prompt_ids(ids)
        return ids

    async def completions(self, body: CompletionRequest) -> Response:
        engine = self.engine
        model = engine.check_model(body.model)
        if body.n != 1:
            raise EngineError("Only n=1 is supported by the tracefleet engine", param="n")
        if body.echo:
            raise EngineError("echo is not supported by the tracefleet engine", param="echo")
        prompt_ids = self.prompt_ids(body)
        max_tokens = engine.max_tokens_for(len(prompt_ids), body.max_tokens)
        top = body.logprobs or 0
        req = GenerationRequest(prompt_ids, engine.sampling(body, max_tokens, top), None)
        gen = Generation(prompt_ids)
        rid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        steps = engine.generate(req, stop_strings(body.stop), body.include_stop_str_in_output,
                                body.skip_special_tokens, gen)
        if body.stream:
            return StreamingResponse(self.stream(body, model, rid, created, gen, steps),
                                     media_type="text/event-stream")
        async for _ in steps:
            pass
        text = "".join(s.text for s in gen.steps)
        choice = {
            "index": 0, "text": text,
            "logprobs": self.logprobs(gen.steps, top, 0) if body.logprobs is not None else None,
            "finish_reason": gen.steps[-1].finish_reason if gen.steps else "length",
            "stop_reason": gen.steps[-1].stop_reason if gen.steps else None,
            "prompt_logprobs": engine.prompt_logprobs_body(gen.prompt_logprobs),
            "prompt_token_ids": prompt_ids if body.return_token_ids else None,
            "token_ids": [s.token.token_id for s in gen.steps] if body.return_token_ids else None,
        }
        return Response(orjson.dumps({
            "id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice],
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": {**engine.usage(len(prompt_ids), len(gen.steps)), "prompt_tokens_details": None},
            "kv_transfer_params": None,
        }), media_type="application/json")

    async def stream(self, body: CompletionRequest, model: str, rid: str, created: int,
                     gen: Generation, steps: AsyncIterator[Step]) -> AsyncIterator[bytes]:
        top = body.logprobs or 0
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        n_out = 0
        offset = 0
        try:
            async for step in steps:
                n_out += 1
                choice: dict[str, Any] = {
                    "index": 0, "text": step.text,
                    "logprobs": self.logprobs([step], top, offset) if body.logprobs is not None else None,
                    "finish_reason": step.finish_reason, "stop_reason": step.stop_reason,
                }
                offset += len(step.text)
                if body.return_token_ids:
                    if n_out == 1:
                        choice["prompt_token_ids"] = gen.prompt_ids
                    choice["token_ids"] = [step.token.token_id]
                if n_out == 1 and body.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = self.engine.prompt_logprobs_body(gen.prompt_logprobs)
                yield sse({"id": rid, "object": "text_completion", "created": created, "model": model,
                           "choices": [choice]})
        except Exception as exc:  # noqa: BLE001 - a stream cannot change its status any more
            yield self.engine.stream_failure(exc)
            return
        finally:
            await steps.aclose()  # type: ignore[attr-defined]
        if include_usage:
            yield sse({"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [],
                       "system_fingerprint": SYSTEM_FINGERPRINT, "usage": self.engine.usage(len(gen.prompt_ids), n_out)})
        yield SSE_DONE
