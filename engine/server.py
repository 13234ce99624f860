"""The engine's HTTP server: the subset of vLLM's OpenAI-compatible API that tracefleet uses.

`create_app(backend)` serves any `Backend` (llama.cpp on CPU, or the scripted one for harness tests):
GET /health, GET /v1/models, POST /tokenize, POST /detokenize, POST /v1/completions (text or token-id
prompt) and POST /v1/chat/completions (chat template applied here, hermes tool calls parsed here),
streaming or not, with vLLM's `return_token_ids` (prompt_token_ids + per-choice token_ids; in streams,
the first chunk carries the prompt ids and each chunk the ids it adds) and OpenAI-shaped logprobs.

Every sampled token is delivered in exactly one chunk, even when its text is held back (a possible
tool-call tag or stop string): such chunks carry token ids and logprobs with an empty delta.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .backend import Backend, ChatContext, GenerationRequest, PromptLogprob, SampledToken, SamplingParams
from tracefleet.formats.chat_template import TemplateError, render_chat
from .protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, EngineError,
                       ForcedReplies, TokenizeRequest)
from tracefleet.formats.tokenizer import IncrementalDetokenizer
from tracefleet.formats.tool_parser import StreamingToolParser


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


SYSTEM_FINGERPRINT = "tracefleet-engine"  # vLLM sends `vllm-<version>-<hash>` in the same places


def _json(obj: Any) -> bytes:
    return orjson.dumps(obj)


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class EngineApp:
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

    # --- helpers -------------------------------------------------------------------------------
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

    # --- generation ----------------------------------------------------------------------------
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

    # --- logprob shapes ------------------------------------------------------------------------
    def chat_logprob(self, tok: SampledToken, top: int) -> dict[str, Any]:
        text = self.token_text(tok.token_id)
        entry: dict[str, Any] = {"token": text, "logprob": tok.logprob, "bytes": list(text.encode()),
                                 "top_logprobs": []}
        if top:
            entry["top_logprobs"] = [
                {"token": (t := self.token_text(i)), "logprob": lp, "bytes": list(t.encode())}
                for i, lp in tok.top_logprobs[:top]]
        return entry

    def completion_logprobs(self, steps: list[Step], top: int, offset: int) -> dict[str, Any]:
        tokens, lps, tops, offsets = [], [], [], []
        pos = offset
        for st in steps:
            text = self.token_text(st.token.token_id)
            tokens.append(text)
            lps.append(st.token.logprob)
            alts = {self.token_text(i): lp for i, lp in st.token.top_logprobs[:top]} if top else {}
            alts.setdefault(text, st.token.logprob)
            tops.append(alts)
            offsets.append(pos)
            pos += len(st.text)
        return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": tops}

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

    def sampling(self, body: ChatCompletionRequest | CompletionRequest, max_tokens: int, top: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            seed=body.seed, top_logprobs=top, prompt_logprobs=body.prompt_logprobs,
            ignore_eos=body.ignore_eos)

    # --- routes --------------------------------------------------------------------------------
    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response:
        model = self.check_model(body.model)
        if body.n != 1:
            raise EngineError("Only n=1 is supported by the tracefleet engine", param="n")
        use_tools = bool(body.tools) and body.tool_choice != "none"
        prompt = self.render(body.messages, body.tools if body.tool_choice != "none" else None,
                             body.add_generation_prompt, body.continue_final_message, body.chat_template_kwargs)
        prompt_ids = self.backend.tokenizer.encode(prompt, add_special_tokens=False)
        requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        max_tokens = self.max_tokens_for(len(prompt_ids), requested)
        top = (body.top_logprobs or 0) if body.logprobs else 0
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        req = GenerationRequest(prompt_ids, self.sampling(body, max_tokens, top),
                                ChatContext(body.messages, body.tools if use_tools else None))
        gen = Generation(prompt_ids)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        steps = self.generate(req, stop, body.include_stop_str_in_output, body.skip_special_tokens, gen)
        if body.stream:
            return StreamingResponse(self._chat_stream(body, model, rid, created, gen, steps, use_tools, request),
                                     media_type="text/event-stream")
        async for _ in steps:
            pass
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
            "logprobs": {"content": [self.chat_logprob(s.token, top) for s in gen.steps]} if body.logprobs else None,
            "finish_reason": finish, "stop_reason": gen.steps[-1].stop_reason if gen.steps else None,
            "token_ids": [s.token.token_id for s in gen.steps] if body.return_token_ids else None,
        }
        n_out = len(gen.steps)
        return Response(_json({
            "id": rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice],
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": n_out,
                      "total_tokens": len(prompt_ids) + n_out, "prompt_tokens_details": None},
            "prompt_logprobs": self.prompt_logprobs_body(gen.prompt_logprobs),
            "prompt_token_ids": prompt_ids if body.return_token_ids else None,
            "kv_transfer_params": None,
        }), media_type="application/json")

    async def _chat_stream(self, body: ChatCompletionRequest, model: str, rid: str, created: int, gen: Generation,
                           steps: AsyncIterator[Step], use_tools: bool, request: Request) -> AsyncIterator[bytes]:
        def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
            return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": choices, **extra}

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
                    yield _sse(first)
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
                    "logprobs": {"content": [self.chat_logprob(step.token, top)]} if body.logprobs else None,
                    "finish_reason": finish,
                }
                if finish is not None:
                    choice["stop_reason"] = step.stop_reason
                if body.return_token_ids:
                    choice["token_ids"] = [step.token.token_id]
                extra = {}
                if include_usage and continuous:
                    extra["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                                      "total_tokens": n_prompt + n_out}
                yield _sse(chunk([choice], **extra))
        except EngineError as exc:
            yield _sse(exc.body())
            return
        except Exception as exc:  # noqa: BLE001 - a stream cannot change its status any more
            yield _sse(EngineError(f"engine failure: {exc}", 500, "InternalServerError").body())
            return
        finally:
            await steps.aclose()  # a client that went away stops the backend at the next token
        if not n_out:
            yield _sse(first)
        if include_usage:
            yield _sse(chunk([], system_fingerprint=SYSTEM_FINGERPRINT,
                             usage={"prompt_tokens": n_prompt, "completion_tokens": n_out,
                                        "total_tokens": n_prompt + n_out}))
        yield b"data: [DONE]\n\n"

    def completion_prompt(self, body: CompletionRequest) -> list[int]:
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise EngineError("Only one prompt per request is supported by the tracefleet engine",
                                  param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.backend.tokenizer.encode(prompt, add_special_tokens=body.add_special_tokens)
        else:
            ids = list(prompt)
        self.check_prompt_ids(ids)
        return ids

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        model = self.check_model(body.model)
        if body.n != 1:
            raise EngineError("Only n=1 is supported by the tracefleet engine", param="n")
        if body.echo:
            raise EngineError("echo is not supported by the tracefleet engine", param="echo")
        prompt_ids = self.completion_prompt(body)
        max_tokens = self.max_tokens_for(len(prompt_ids), body.max_tokens)
        top = body.logprobs or 0
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        req = GenerationRequest(prompt_ids, self.sampling(body, max_tokens, top), None)
        gen = Generation(prompt_ids)
        rid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        steps = self.generate(req, stop, body.include_stop_str_in_output, body.skip_special_tokens, gen)
        if body.stream:
            return StreamingResponse(self._completion_stream(body, model, rid, created, gen, steps),
                                     media_type="text/event-stream")
        async for _ in steps:
            pass
        text = "".join(s.text for s in gen.steps)
        choice = {
            "index": 0, "text": text,
            "logprobs": self.completion_logprobs(gen.steps, top, 0) if body.logprobs is not None else None,
            "finish_reason": gen.steps[-1].finish_reason if gen.steps else "length",
            "stop_reason": gen.steps[-1].stop_reason if gen.steps else None,
            "prompt_logprobs": self.prompt_logprobs_body(gen.prompt_logprobs),
            "prompt_token_ids": prompt_ids if body.return_token_ids else None,
            "token_ids": [s.token.token_id for s in gen.steps] if body.return_token_ids else None,
        }
        n_out = len(gen.steps)
        return Response(_json({
            "id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice],
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": n_out,
                      "total_tokens": len(prompt_ids) + n_out, "prompt_tokens_details": None},
            "kv_transfer_params": None,
        }), media_type="application/json")

    async def _completion_stream(self, body: CompletionRequest, model: str, rid: str, created: int,
                                 gen: Generation, steps: AsyncIterator[Step]) -> AsyncIterator[bytes]:
        top = body.logprobs or 0
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        n_prompt = len(gen.prompt_ids)
        n_out = 0
        offset = 0
        try:
            async for step in steps:
                n_out += 1
                choice: dict[str, Any] = {
                    "index": 0, "text": step.text,
                    "logprobs": self.completion_logprobs([step], top, offset) if body.logprobs is not None else None,
                    "finish_reason": step.finish_reason, "stop_reason": step.stop_reason,
                }
                offset += len(step.text)
                if body.return_token_ids:
                    if n_out == 1:
                        choice["prompt_token_ids"] = gen.prompt_ids
                    choice["token_ids"] = [step.token.token_id]
                if n_out == 1 and body.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = self.prompt_logprobs_body(gen.prompt_logprobs)
                yield _sse({"id": rid, "object": "text_completion", "created": created, "model": model,
                            "choices": [choice]})
        except EngineError as exc:
            yield _sse(exc.body())
            return
        except Exception as exc:  # noqa: BLE001
            yield _sse(EngineError(f"engine failure: {exc}", 500, "InternalServerError").body())
            return
        finally:
            await steps.aclose()
        if include_usage:
            yield _sse({"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [],
                        "system_fingerprint": SYSTEM_FINGERPRINT,
                        "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                                  "total_tokens": n_prompt + n_out}})
        yield b"data: [DONE]\n\n"

    def tokenize(self, body: TokenizeRequest) -> dict[str, Any]:
        self.check_model(body.model)
        tok = self.backend.tokenizer
        if body.messages is not None:
            text = self.render(body.messages, body.tools, body.add_generation_prompt, body.continue_final_message,
                               body.chat_template_kwargs)
            ids = tok.encode(text, add_special_tokens=bool(body.add_special_tokens))
        elif body.prompt is not None:
            ids = tok.encode(body.prompt, add_special_tokens=body.add_special_tokens is not False)
        else:
            raise EngineError("Either prompt or messages is required", param="prompt")
        out: dict[str, Any] = {"count": len(ids), "max_model_len": self.backend.max_model_len, "tokens": ids,
                               "token_strs": [tok.token_text(i) for i in ids] if body.return_token_strs else None}
        return out

    def detokenize(self, body: DetokenizeRequest) -> dict[str, Any]:
        self.check_model(body.model)
        self.check_prompt_ids(body.tokens) if body.tokens else None
        return {"prompt": self.backend.tokenizer.decode(body.tokens, skip_special_tokens=False)}

    def metrics(self) -> bytes:
        """Prometheus text with vLLM's names, so that tests and tools read either engine alike."""
        labels = f'{{engine="0",model_name="{self.names[0]}"}}'
        return (f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{labels} {float(self.running)}\n"
                f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{labels} 0.0\n").encode()

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": self.created, "owned_by": "tracefleet", "root": self.root or name,
             "parent": None, "max_model_len": self.backend.max_model_len, "permission": [
                 {"id": f"modelperm-{name}", "object": "model_permission", "created": self.created,
                  "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                  "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                  "organization": "*", "group": None, "is_blocking": False}]}
            for name in self.names]}


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


def create_app(backend: Backend, *, served_model_names: list[str] | None = None,
               default_max_tokens: int | None = None, clamp_max_tokens: bool = False,
               model_root: str | None = None) -> FastAPI:
    """The engine app for one backend. `default_max_tokens` caps replies that give no max_tokens
    (vLLM would allow the whole remaining context; a CPU model should not spend minutes on it).
    `clamp_max_tokens` shortens a max_tokens that does not fit the context instead of answering 400
    (vLLM answers 400; real harnesses ask for 32k-token replies that a 4k CPU context cannot hold)."""
    engine = EngineApp(backend, served_model_names, default_max_tokens, clamp_max_tokens, model_root)
    app = FastAPI(title="tracefleet engine", version="0.1.0", docs_url=None, redoc_url=None)
    app.state.engine = engine

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

    async def parse(request: Request, model: type) -> Any:
        raw = await request.body()
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise EngineError(f"request body is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise EngineError("request body must be a JSON object")
        try:
            return model.model_validate(data)
        except Exception as exc:
            errors = getattr(exc, "errors", None)
            if callable(errors):
                msg = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg')}" for e in errors())
            else:
                msg = str(exc)
            raise EngineError(msg) from exc

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": "tracefleet-engine-0.1.0"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return engine.models()

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        return engine.tokenize(await parse(request, TokenizeRequest))

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        return engine.detokenize(await parse(request, DetokenizeRequest))

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await until_disconnect(request, engine.chat(await parse(request, ChatCompletionRequest), request))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await until_disconnect(request, engine.completions(await parse(request, CompletionRequest), request))

    script_routes = getattr(backend, "script", None) is not None
    if script_routes:
        from .scripted import Script

        # Test-only control of the scripted backend (absent for real models).
        @app.get("/scripted/script")
        async def get_script() -> dict[str, Any]:
            return backend.script.model_dump()  # type: ignore[attr-defined]

        @app.put("/scripted/script")
        async def put_script(request: Request) -> dict[str, Any]:
            backend.script = await parse(request, Script)  # type: ignore[attr-defined]
            return backend.script.model_dump()  # type: ignore[attr-defined]

    if isinstance(getattr(backend, "forced_replies", None), collections.deque):
        # Test/bench control of a real model's next replies (teacher forcing; see LlamaBackend).
        @app.get("/forced/replies")
        async def get_forced() -> dict[str, Any]:
            return {"replies": list(backend.forced_replies)}  # type: ignore[attr-defined]

        @app.put("/forced/replies")
        async def put_forced(request: Request) -> dict[str, Any]:
            body = await parse(request, ForcedReplies)
            backend.forced_replies.clear()  # type: ignore[attr-defined]
            backend.forced_replies.extend(body.replies)  # type: ignore[attr-defined]
            return {"replies": body.replies}

    return app


AppFactory = Callable[[Backend], FastAPI]
