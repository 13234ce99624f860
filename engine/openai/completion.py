"""POST /v1/completions: a text or token-id prompt (one per request), whole or streamed, with vLLM's
`return_token_ids` (the first chunk carries the prompt ids) and OpenAI's completion logprobs."""

from __future__ import annotations

from typing import Any, AsyncIterator

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from tracefleet.engine.openai.serving import (SSE_DONE, SYSTEM_FINGERPRINT, Endpoint, Started, Step, engine_of,
                                              parse_body, sse, until_disconnect)
from tracefleet.engine.protocol import COMPLETIONS, CompletionRequest, EngineError

router = APIRouter()


@router.post(COMPLETIONS)
async def create_completion(request: Request) -> Response:
    serving = ServingCompletion(engine_of(request))
    return await until_disconnect(request, serving.completions(await parse_body(request, CompletionRequest)))


class ServingCompletion(Endpoint):
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
        model = engine.check_request(body)
        if body.echo:
            raise EngineError("echo is not supported by the tracefleet engine", param="echo")
        prompt_ids = self.prompt_ids(body)
        max_tokens = engine.max_tokens_for(len(prompt_ids), body.max_tokens)
        top = body.logprobs or 0
        started = engine.start(body, model, prompt_ids, max_tokens, top, None, "cmpl")
        if body.stream:
            return StreamingResponse(self.stream(body, started), media_type="text/event-stream")
        gen = await started.finished()
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
            "id": started.rid, "object": "text_completion", "created": started.created, "model": model,
            "choices": [choice],
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": {**engine.usage(len(prompt_ids), len(gen.steps)), "prompt_tokens_details": None},
            "kv_transfer_params": None,
        }), media_type="application/json")

    async def stream(self, body: CompletionRequest, started: Started) -> AsyncIterator[bytes]:
        def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
            return {"id": started.rid, "object": "text_completion", "created": started.created,
                    "model": started.model, "choices": choices, **extra}

        gen, steps = started.gen, started.steps
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
                yield sse(chunk([choice]))
        except Exception as exc:  # noqa: BLE001 - a stream cannot change its status any more
            yield self.engine.stream_failure(exc)
            return
        finally:
            await steps.aclose()  # type: ignore[attr-defined]
        if include_usage:
            yield sse(chunk([], system_fingerprint=SYSTEM_FINGERPRINT,
                            usage=self.engine.usage(len(gen.prompt_ids), n_out)))
        yield SSE_DONE
