"""A zero-latency stand-in for the engine's vLLM API, for the proxy benches only (tests use the real
engine server). Answers every chat call, and every token-id `/v1/completions` call (exact capture mode),
with N fixed tokens, with token ids and logprobs. `answer` gives the tokens as (id, text) pairs (a real
tokenizer's, so that exact mode's splicer sees a turn it can reuse); by default N made-up ones."""

from __future__ import annotations

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

WORDS = ["Hello", " from", " the", " fake", " engine", ".", " It", " answers", " instantly", "!"]


def logprob(token: str) -> dict:
    """One sampled token's logprob entry, every field vLLM sends (strict clients validate them all)."""
    return {"token": token, "logprob": -0.5, "bytes": list(token.encode()), "top_logprobs": []}


def fake_engine_app(tokens: int = 16, model: str = "fake-model",
                    answer: list[tuple[int, str]] | None = None) -> Starlette:
    answer = answer or [(100 + i, WORDS[i % len(WORDS)]) for i in range(tokens)]
    texts = [t for _, t in answer]
    ids = [i for i, _ in answer]
    tokens = len(answer)

    async def models(request: Request) -> Response:
        return Response(orjson.dumps({"object": "list", "data": [{"id": model, "object": "model"}]}), media_type="application/json")

    async def tokenize(request: Request) -> Response:
        body = orjson.loads(await request.body())
        n = max(1, len(orjson.dumps(body.get("messages") or body.get("prompt"))) // 4)
        return Response(orjson.dumps({"tokens": list(range(n)), "count": n}), media_type="application/json")

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        prompt_ids = list(range(1, 1 + max(1, len(orjson.dumps(body["messages"])) // 8)))
        if not body.get("stream"):
            return Response(orjson.dumps({
                "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
                "prompt_token_ids": prompt_ids,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(texts)},
                             "finish_reason": "stop", "token_ids": ids,
                             "logprobs": {"content": [logprob(t) for t in texts]}}],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": tokens, "total_tokens": len(prompt_ids) + tokens},
            }), media_type="application/json")

        async def gen():
            head = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model}
            yield b"data: " + orjson.dumps({**head, "prompt_token_ids": prompt_ids, "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}) + b"\n\n"
            for i, t in enumerate(texts):
                yield b"data: " + orjson.dumps({**head, "choices": [
                    {"index": 0, "delta": {"content": t}, "token_ids": [ids[i]],
                     "logprobs": {"content": [logprob(t)]},
                     "finish_reason": "stop" if i == tokens - 1 else None}]}) + b"\n\n"
            yield b"data: " + orjson.dumps({**head, "choices": [], "usage": {
                "prompt_tokens": len(prompt_ids), "completion_tokens": tokens,
                "total_tokens": len(prompt_ids) + tokens}}) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    async def completions(request: Request) -> Response:
        body = orjson.loads(await request.body())
        prompt_ids = body["prompt"]
        head = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": model}
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": tokens, "total_tokens": len(prompt_ids) + tokens}
        if not body.get("stream"):
            return Response(orjson.dumps({**head, "choices": [
                {"index": 0, "text": "".join(texts), "token_ids": ids, "prompt_token_ids": prompt_ids, "finish_reason": "stop",
                 "logprobs": {"token_logprobs": [-0.5] * tokens, "tokens": texts}}], "usage": usage}),
                media_type="application/json")

        async def gen():
            for i, t in enumerate(texts):
                choice = {"index": 0, "text": t, "token_ids": [ids[i]], "logprobs": {"token_logprobs": [-0.5], "tokens": [t]},
                          "finish_reason": "stop" if i == tokens - 1 else None}
                if i == 0:
                    choice["prompt_token_ids"] = prompt_ids
                yield b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"
            yield b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    return Starlette(routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models), Route("/tokenize", tokenize, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/health", lambda r: Response(b"ok")),
    ])
