"""What the generation endpoints share: `EngineServing` (one per app, on `app.state.engine`) validates
against the model, renders chats, bounds max_tokens by the context, and runs the backend in a worker thread
as a stream of `Step`s (stop strings held back, finish reasons as vLLM reports them); request parsing and
the SSE framing."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from tracefleet.engine.backend import (Backend, ChatContext, GenerationRequest, PromptLogprob, SampledToken,
                                      SamplingParams)
from tracefleet.engine.protocol import ChatCompletionRequest, CompletionRequest, EngineError
from tracefleet.formats.chat_template import TemplateError, render_chat
from tracefleet.formats.tokenizer import IncrementalDetokenizer

SYSTEM_FINGERPRINT = "tracefleet-engine"  # vLLM sends `vllm-<version>-<hash>` in the same places

M = TypeVar("M", bound=BaseModel)


@dataclass
class Step:
    """One sampled token and the text it releases (after stop-string hold-back)."""

    token: SampledToken
    text: str
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass
class Generation:
    prompt_ids: list[int]
    prompt_logprobs: list[PromptLogprob | None] | None = None
    steps: list[Step] = field(default_factory=list)


@dataclass
class Started:
    """A generation under way, and what its answer is labelled with (whole or streamed)."""

    model: str
    rid: str
    created: int
    gen: Generation
    steps: AsyncIterator[Step]

    async def finished(self) -> Generation:
        async for _ in self.steps:
            pass
        return self.gen


class Endpoint:
    """One generation endpoint's serving object (vLLM's `OpenAIServing*`), over the app's `EngineServing`."""

    def __init__(self, engine: EngineServing) -> None:
        self.engine = engine


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def validation_message(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors())


async def parse_body(request: Request, model: type[M]) -> M:
    """The request body as `model`, or vLLM's 400."""
    raw = await request.body()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise EngineError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise EngineError("request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise EngineError(validation_message(exc)) from exc


def engine_of(request: Request) -> EngineServing:
    engine: EngineServing = request.app.state.engine
    return engine


async def until_disconnect(request: Request, answer: Any) -> Response:
    """The handler's answer, or nothing once the client hangs up: a non-streamed generation is
    cancelled (its tokens stop) when its caller goes away, as vLLM's `with_cancellation` does. (A
    streamed one stops when StreamingResponse sees the disconnect.)"""
    work = asyncio.ensure_future(answer)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
    if work in done:
        return work.result()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    return Response(status_code=499)  # nobody reads it


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def stop_strings(stop: str | list[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


class EngineServing:
    """The model behind every endpoint, and what they share about serving it."""

    def __init__(self, backend: Backend, served_model_names: list[str] | None = None,
                 default_max_tokens: int | None = None, clamp_max_tokens: bool = False,
                 model_root: str | None = None) -> None:
        self.backend = backend
        self.names = served_model_names or [backend.model_name]
        self.root = model_root  # /v1/models' `root`: the model as given (`--model`), as vLLM reports it
        self.default_max_tokens = default_max_tokens
        self.clamp_max_tokens = clamp_max_tokens
        self.created = int(time.time())
        self.running = 0  # generations under way: vLLM's `vllm:num_requests_running` (GET /metrics)

    # --- validation ----------------------------------------------------------------------------
    def check_request(self, body: ChatCompletionRequest | CompletionRequest) -> str:
        """The served model's name for `body`, or the 4xx vLLM gives for what this engine cannot serve."""
        model = self.check_model(body.model)
        if body.n != 1:
            raise EngineError("Only n=1 is supported by the tracefleet engine", param="n")
        return model

    def check_model(self, model: str | None) -> str:
        if model is None or model in self.names:
            return self.names[0]
        raise EngineError(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               add_generation_prompt: bool = True, continue_final_message: bool = False,
               chat_template_kwargs: dict[str, Any] | None = None) -> str:
        if not messages:
            raise EngineError("messages must not be empty", param="messages")
        if continue_final_message and add_generation_prompt:
            raise EngineError("continue_final_message and add_generation_prompt cannot both be true")
        kwargs = dict(self.backend.template_vars)
        kwargs.update(chat_template_kwargs or {})
        try:
            text = render_chat(self.backend.chat_template, messages, tools=tools,
                               add_generation_prompt=add_generation_prompt, **kwargs)
        except TemplateError as exc:
            raise EngineError(str(exc), param="messages") from exc
        if continue_final_message:
            last = messages[-1].get("content")
            if isinstance(last, str) and last and last in text:
                text = text[: text.rindex(last) + len(last)]
        return text

    def token_text(self, token_id: int) -> str:
        return self.backend.tokenizer.token_text(token_id)

    def max_tokens_for(self, prompt_len: int, requested: int | None) -> int:
        limit = self.backend.max_model_len
        if prompt_len >= limit and not (requested == 0 and prompt_len == limit):
            raise EngineError(
                f"This model's maximum context length is {limit} tokens. However, your request has "
                f"{prompt_len} input tokens. Please reduce the length of the input messages.")
        if requested is None:
            room = limit - prompt_len
            return min(room, self.default_max_tokens) if self.default_max_tokens else room
        if prompt_len + requested > limit:
            if self.clamp_max_tokens:
                return limit - prompt_len
            raise EngineError(
                f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This model's maximum "
                f"context length is {limit} tokens and your request has {prompt_len} input tokens "
                f"({requested} > {limit} - {prompt_len}).")
        return requested

    def check_prompt_ids(self, ids: list[int]) -> None:
        vocab = self.backend.tokenizer.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise EngineError(f"Token id {bad[0]} is out of vocabulary (size {vocab})", param="prompt")
        if not ids:
            raise EngineError("The prompt must not be empty", param="prompt")

    def sampling(self, body: ChatCompletionRequest | CompletionRequest, max_tokens: int, top: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            seed=body.seed, top_logprobs=top, prompt_logprobs=body.prompt_logprobs,
            ignore_eos=body.ignore_eos)

    # --- generation ----------------------------------------------------------------------------
    def start(self, body: ChatCompletionRequest | CompletionRequest, model: str, prompt_ids: list[int],
              max_tokens: int, top: int, context: ChatContext | None, id_prefix: str) -> Started:
        """Start generating for `body` (already checked): the steps come as the caller reads them."""
        req = GenerationRequest(prompt_ids, self.sampling(body, max_tokens, top), context)
        gen = Generation(prompt_ids)
        steps = self.generate(req, stop_strings(body.stop), body.include_stop_str_in_output, body.skip_special_tokens,
                              gen)
        return Started(model, f"{id_prefix}-{uuid.uuid4().hex}", int(time.time()), gen, steps)

    async def generate(self, req: GenerationRequest, stop: list[str], include_stop: bool,
                       skip_special: bool, gen: Generation) -> AsyncIterator[Step]:
        """Run the backend in a worker thread; yield steps as tokens arrive."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancelled = threading.Event()
        req.cancelled = cancelled

        def put(kind: str, value: Any) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))

        def worker() -> None:
            it = None
            try:
                stream = self.backend.generate(req)
                sent_prompt = False
                it = iter(stream)
                for tok in it:
                    if not sent_prompt:
                        put("prompt", stream.prompt_logprobs)
                        sent_prompt = True
                    put("tok", tok)
                    if cancelled.is_set():
                        break
                if not sent_prompt:
                    put("prompt", stream.prompt_logprobs)
            except BaseException as exc:  # noqa: BLE001 - reported to the client
                put("err", exc)
            finally:
                close = getattr(it, "close", None)
                if close is not None:
                    close()  # release the backend (llama.cpp's lock) as soon as we stop reading
                put("end", None)

        threading.Thread(target=worker, name="engine-generate", daemon=True).start()
        self.running += 1
        detok = IncrementalDetokenizer(self.backend.tokenizer, skip_special_tokens=skip_special)
        hold = max((len(s) for s in stop), default=1) - 1
        pending = ""  # text not yet released (could be the start of a stop string)
        count = 0
        max_tokens = req.params.max_tokens
        stop_ids = self.backend.stop_token_ids
        finished = False
        try:
            while True:
                kind, value = await queue.get()
                if kind == "end":
                    break
                if kind == "err":
                    raise value
                if kind == "prompt":
                    gen.prompt_logprobs = value
                    continue
                if finished:
                    continue
                tok: SampledToken = value
                count += 1
                pending += detok.push(tok.token_id)
                finish: str | None = None
                stop_reason: str | int | None = None
                if tok.token_id in stop_ids and not req.params.ignore_eos:
                    finish = "stop"
                    stop_reason = None
                elif count >= max_tokens:
                    finish = "length"
                if finish is not None:
                    pending += detok.flush()
                for s in stop:
                    at = pending.find(s)
                    if at >= 0:
                        pending = pending[: at + len(s)] if include_stop else pending[:at]
                        finish, stop_reason = "stop", s
                        break
                if finish is None:
                    release = pending[: max(0, len(pending) - hold)] if stop else pending
                else:
                    release = pending
                pending = pending[len(release):]
                step = Step(tok, release, finish, stop_reason)
                gen.steps.append(step)
                yield step
                if finish is not None:
                    finished = True
                    cancelled.set()
            if not finished and gen.steps:
                # The backend ended without EOS or the length limit (e.g. scripted script exhausted).
                last = gen.steps[-1]
                tail = pending + detok.flush()
                if tail:
                    last.text += tail
                last.finish_reason = last.finish_reason or "stop"
        finally:
            cancelled.set()
            self.running -= 1

    # --- shapes shared by chat and completions --------------------------------------------------
    def prompt_logprobs_body(self, pls: list[PromptLogprob | None] | None) -> list[Any] | None:
        if pls is None:
            return None
        out: list[Any] = []
        for pl in pls:
            if pl is None:
                out.append(None)
                continue
            entry = {str(pl.token_id): {"logprob": pl.logprob, "rank": pl.rank,
                                        "decoded_token": self.token_text(pl.token_id)}}
            for rank, (i, lp) in enumerate(pl.top_logprobs, start=1):
                entry.setdefault(str(i), {"logprob": lp, "rank": rank, "decoded_token": self.token_text(i)})
            out.append(entry)
        return out

    @staticmethod
    def usage(n_prompt: int, n_out: int) -> dict[str, int]:
        return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}

    @staticmethod
    def stream_failure(exc: Exception) -> bytes:
        """A stream cannot change its status any more: the error goes out as an event."""
        error = exc if isinstance(exc, EngineError) else EngineError(f"engine failure: {exc}", 500, "InternalServerError")
        return sse(error.body())
