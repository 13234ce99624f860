"""POST /v1/chat/completions: the chat template applied here, hermes tool calls parsed here, whole or
streamed (vLLM's chunk sequence: the role chunk with the first output, one chunk per sampled token, usage,
[DONE]); `return_token_ids` and OpenAI-shaped logprobs as vLLM gives them."""

from __future__ import annotations

from typing import Any, AsyncIterator

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from tracefleet.engine.backend import ChatContext, SampledToken
from tracefleet.engine.openai.serving import (SSE_DONE, SYSTEM_FINGERPRINT, Endpoint, Started, engine_of,
                                              parse_body, sse, until_disconnect)
from tracefleet.engine.protocol import CHAT_COMPLETIONS, ChatCompletionRequest
from tracefleet.formats.tool_parser import StreamingToolParser

router = APIRouter()


@router.post(CHAT_COMPLETIONS)
async def create_chat_completion(request: Request) -> Response:
    serving = ServingChat(engine_of(request))
    return await until_disconnect(request, serving.chat(await parse_body(request, ChatCompletionRequest)))


class ServingChat(Endpoint):
    def logprob(self, tok: SampledToken, top: int) -> dict[str, Any]:
        token_text = self.engine.token_text
        text = token_text(tok.token_id)
        entry: dict[str, Any] = {"token": text, "logprob": tok.logprob, "bytes": list(text.encode()),
                                 "top_logprobs": []}
        if top:
            entry["top_logprobs"] = [
                {"token": (t := token_text(i)), "logprob": lp, "bytes": list(t.encode())}
                for i, lp in tok.top_logprobs[:top]]
        return entry

    async def chat(self, body: ChatCompletionRequest) -> Response:
        engine = self.engine
        model = engine.check_request(body)
        use_tools = bool(body.tools) and body.tool_choice != "none"
        prompt = engine.render(body.messages, body.tools if body.tool_choice != "none" else None,
                               body.add_generation_prompt, body.continue_final_message, body.chat_template_kwargs)
        prompt_ids = engine.backend.tokenizer.encode(prompt, add_special_tokens=False)
        requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        max_tokens = engine.max_tokens_for(len(prompt_ids), requested)
        top = (body.top_logprobs or 0) if body.logprobs else 0
        started = engine.start(body, model, prompt_ids, max_tokens, top,
                               ChatContext(body.messages, body.tools if use_tools else None), "chatcmpl")
        if body.stream:
            return StreamingResponse(self.stream(body, started, use_tools), media_type="text/event-stream")
        gen = await started.finished()
        text = "".join(s.text for s in gen.steps)
        parser = StreamingToolParser() if use_tools else None
        calls = []
        content: str | None = text
        if parser is not None:
            content, calls = parser.feed(text)
            tail, more = parser.finish()
            content, calls = content + tail, calls + more
        finish = gen.steps[-1].finish_reason if gen.steps else "length"
        if calls and finish == "stop":
            finish = "tool_calls"
        # as vLLM >= 0.17: the reasoning field is `reasoning`, and `tool_calls` is there only when there are calls
        message: dict[str, Any] = {"role": "assistant", "reasoning": None,
                                   "content": content if (content or not calls) else None}
        if calls:
            message["tool_calls"] = [c.openai() for c in calls]
        choice: dict[str, Any] = {
            "index": 0, "message": message,
            "logprobs": {"content": [self.logprob(s.token, top) for s in gen.steps]} if body.logprobs else None,
            "finish_reason": finish, "stop_reason": gen.steps[-1].stop_reason if gen.steps else None,
            "token_ids": [s.token.token_id for s in gen.steps] if body.return_token_ids else None,
        }
        return Response(orjson.dumps({
            "id": started.rid, "object": "chat.completion", "created": started.created, "model": model,
            "choices": [choice],
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": {**engine.usage(len(prompt_ids), len(gen.steps)), "prompt_tokens_details": None},
            "prompt_logprobs": engine.prompt_logprobs_body(gen.prompt_logprobs),
            "prompt_token_ids": prompt_ids if body.return_token_ids else None,
            "kv_transfer_params": None,
        }), media_type="application/json")

    async def stream(self, body: ChatCompletionRequest, started: Started, use_tools: bool) -> AsyncIterator[bytes]:
        def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
            return {"id": started.rid, "object": "chat.completion.chunk", "created": started.created,
                    "model": started.model, "choices": choices, **extra}

        gen, steps = started.gen, started.steps
        usage = self.engine.usage
        top = (body.top_logprobs or 0) if body.logprobs else 0
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        continuous = bool(body.stream_options and body.stream_options.continuous_usage_stats)
        n_prompt = len(gen.prompt_ids)
        parser = StreamingToolParser() if use_tools else None
        first = chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                        "finish_reason": None}])
        if body.return_token_ids:
            first["prompt_token_ids"] = gen.prompt_ids
        n_calls = 0
        n_out = 0
        try:
            async for step in steps:
                if not n_out:  # as vLLM: the role chunk goes out with the first output (after prefill), not before
                    yield sse(first)
                n_out += 1
                delta: dict[str, Any] = {}
                text = step.text
                calls = []
                if parser is not None:
                    text, calls = parser.feed(text)
                    if step.finish_reason is not None:
                        tail, more = parser.finish()
                        text, calls = text + tail, calls + more
                if text:
                    delta["content"] = text
                if calls:
                    delta["tool_calls"] = [c.openai(index=n_calls + i) for i, c in enumerate(calls)]
                    n_calls += len(calls)
                finish = step.finish_reason
                if finish == "stop" and n_calls:
                    finish = "tool_calls"
                choice: dict[str, Any] = {
                    "index": 0, "delta": delta,
                    "logprobs": {"content": [self.logprob(step.token, top)]} if body.logprobs else None,
                    "finish_reason": finish,
                }
                if finish is not None:
                    choice["stop_reason"] = step.stop_reason
                if body.return_token_ids:
                    choice["token_ids"] = [step.token.token_id]
                extra = {}
                if include_usage and continuous:
                    extra["usage"] = usage(n_prompt, n_out)
                yield sse(chunk([choice], **extra))
        except Exception as exc:  # noqa: BLE001 - a stream cannot change its status any more
            yield self.engine.stream_failure(exc)
            return
        finally:
            await steps.aclose()  # type: ignore[attr-defined]  # a client that went away stops the backend at the next token
        if not n_out:
            yield sse(first)
        if include_usage:
            yield sse(chunk([], system_fingerprint=SYSTEM_FINGERPRINT, usage=usage(n_prompt, n_out)))
        yield SSE_DONE
