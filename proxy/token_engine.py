"""Token engines: how a canonical conversation becomes sampled tokens.

`TokenEngine` is the seam between the dialects and the inference engine. `ServerTokenEngine`
(server capture mode) sends the conversation to the engine's /v1/chat/completions, lets the engine
render the chat template, and records the engine's own prompt ids, sampled ids and logprobs. The
exact token-in mode (issue 4) is a second implementation of the same protocol.

A generation is an async iterator of small events, while everything the capture log needs
accumulates on the `CallState` the caller passed in:
  ("start", None)        the engine accepted the call (prompt ids known)
  ("text", str)          a content delta, forwarded to the harness as it arrives
  ("reasoning", str)     a reasoning delta
  ("tool_call", ToolCall) a complete tool call (emitted once its arguments are complete)
  ("batch", [events])    several of the above that arrived from the engine together (one write)
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from tracefleet.capture import SpliceInfo

from .canonical import Conversation, Message, ToolCall
from .engine_client import EngineClient
from .errors import ProxyError

Event = tuple[str, Any]

_CUSTOM_PARAMS = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "the raw input for this tool"}},
    "required": ["input"],
}


@dataclass(slots=True)
class CallState:
    """Everything known about one call; becomes its capture record."""

    call_id: str
    session_id: str
    dialect: str
    stream: bool
    received_at: float
    policy_version: int = 0
    requested_model: str | None = None
    engine_model: str | None = None
    engine_sent_at: float | None = None
    first_token_at: float | None = None
    done_at: float | None = None
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_parse_errors: list[str] = field(default_factory=list)
    finish_reason: str | None = None  # canonical: stop | length | tool_calls | content_filter
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: ProxyError | None = None

    def take_usage(self, usage: dict[str, Any] | None) -> None:
        """The engine's own token counts, when a response or stream chunk carries them."""
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens", 0)
            self.completion_tokens = usage.get("completion_tokens", 0)

    def settle_usage(self) -> None:
        """Counts the engine did not report are the lengths of the ids recorded for the call."""
        self.prompt_tokens = self.prompt_tokens or len(self.prompt_ids)
        self.completion_tokens = self.completion_tokens or len(self.completion_ids)

    @property
    def output_text(self) -> str:
        return "".join(self.text)

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)


class TokenEngine(Protocol):
    mode: str

    def generate(self, conv: Conversation, state: CallState) -> AsyncIterator[Event]: ...

    async def count_tokens(self, conv: Conversation) -> int: ...

    async def served_model(self) -> str: ...

    def splice_info(self, call_id: str) -> SpliceInfo | None:
        """How this call's prompt was assembled (exact mode); None when the engine rendered it."""
        ...


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def record_tool_call(state: "CallState", name: str, args: str, kinds: dict[str, str], call_id: str = "") -> ToolCall:
    """A sampled tool call in the shape the harness declared the tool (`kinds`: name -> function | custom),
    appended to the call's state. A custom tool's raw input travels as JSON {"input": ...} through the
    engine; when it does not parse, the call is kept and flagged (the evaluator fails it closed)."""
    kind = kinds.get(name, "function")
    if kind == "custom":
        try:
            args = str(orjson.loads(args).get("input", ""))
        except (ValueError, AttributeError):
            state.tool_parse_errors.append(f"custom tool {name!r}: arguments are not a JSON object with 'input'")
    tc = ToolCall(id=call_id or new_tool_call_id(), name=name, arguments=args or "{}", kind=kind)  # type: ignore[arg-type]
    state.tool_calls.append(tc)
    return tc


def engine_messages(conv: Conversation) -> list[dict[str, Any]]:
    """The canonical conversation in OpenAI chat shape, which the engine's chat template renders."""
    out: list[dict[str, Any]] = []
    for msg in conv.messages:
        out.extend(_engine_message(msg))
    return out


def _engine_message(msg: Message) -> list[dict[str, Any]]:
    if msg.role == "tool":
        return [
            {"role": "tool", "tool_call_id": p.id or "", "content": p.text or ""}
            for p in msg.parts
            if p.type == "tool_result"
        ]
    if msg.role == "assistant":
        m: dict[str, Any] = {"role": "assistant", "content": msg.text() or None}
        reasoning = "".join(p.text or "" for p in msg.parts if p.type == "reasoning")
        if reasoning:
            m["reasoning_content"] = reasoning
        calls = [
            {
                "id": p.id or "",
                "type": "function",
                "function": {
                    "name": p.name or "",
                    "arguments": p.arguments if p.kind == "function" else orjson.dumps({"input": p.arguments or ""}).decode(),
                },
            }
            for p in msg.parts
            if p.type == "tool_call"
        ]
        if calls:
            m["tool_calls"] = calls
        if m["content"] is None and not calls:
            m["content"] = ""
        return [m]
    if any(p.type == "image" for p in msg.parts):
        content: list[dict[str, Any]] | str = [
            {"type": "text", "text": p.text or ""} if p.type == "text" else {"type": "image_url", "image_url": {"url": p.image_url}}
            for p in msg.parts
            if p.type in ("text", "image")
        ]
    else:
        content = msg.text()
    return [{"role": msg.role, "content": content}]


def engine_tools(conv: Conversation) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description or "",
                "parameters": t.parameters if t.kind == "function" else _CUSTOM_PARAMS,
            },
        }
        for t in conv.tools
    ]


def engine_tool_choice(choice: str | dict[str, Any] | None) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    return {"type": "function", "function": {"name": choice.get("name", "")}}


class ServedModelName:
    """Mixin for token engines: the configured model name, else the first one the engine lists (asked once)."""

    client: EngineClient
    _model: str | None

    async def served_model(self) -> str:
        if self._model is None:
            models = await self.client.models()
            if not models:
                raise ProxyError("engine_5xx", "engine serves no model")
            self._model = models[0]
        return self._model


class ServerTokenEngine(ServedModelName):
    """Server capture mode: the engine renders the prompt; we record its ids."""

    mode = "server"

    def __init__(self, client: EngineClient, served_model: str | None = None) -> None:
        self.client = client
        self._model = served_model

    def splice_info(self, call_id: str) -> SpliceInfo | None:
        return None  # the engine renders the prompt; drift is found when traces are built

    async def _body(self, conv: Conversation, stream: bool) -> dict[str, Any]:
        s = conv.sampling
        body: dict[str, Any] = {
            "model": await self.served_model(),
            "messages": engine_messages(conv),
            "return_token_ids": True,
            "logprobs": True,
            "top_logprobs": 0,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if conv.tools:
            body["tools"] = engine_tools(conv)
            if conv.tool_choice is not None:
                body["tool_choice"] = engine_tool_choice(conv.tool_choice)
            if conv.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = conv.parallel_tool_calls
        if s.max_tokens is not None:
            body["max_tokens"] = s.max_tokens
        if s.temperature is not None:
            body["temperature"] = s.temperature
        if s.top_p is not None:
            body["top_p"] = s.top_p
        if s.top_k is not None:
            body["top_k"] = s.top_k
        if s.seed is not None:
            body["seed"] = s.seed
        if s.stop:
            body["stop"] = s.stop
        return body

    async def count_tokens(self, conv: Conversation) -> int:
        body: dict[str, Any] = {"model": await self.served_model(), "messages": engine_messages(conv)}
        if conv.tools:
            body["tools"] = engine_tools(conv)
        data = await self.client.tokenize(body)
        return int(data.get("count", len(data.get("tokens", []))))

    async def generate(self, conv: Conversation, state: CallState) -> AsyncIterator[Event]:
        body = await self._body(conv, conv.stream)
        state.engine_model = body["model"]
        state.engine_sent_at = time.time()
        kinds = {t.name: t.kind for t in conv.tools}
        if not conv.stream:
            data = await self.client.chat(body)
            async for ev in self._from_response(data, state, kinds):
                yield ev
            return
        pending: dict[int, list[str]] = {}  # index -> [id, name, arguments]
        started = False
        completion_ids, logprobs, text, reasoning_parts = state.completion_ids, state.logprobs, state.text, state.reasoning
        async for batch in self.client.chat_stream_batches(body):
            # what arrived in one read becomes one ("batch", events) so the app writes it in one go
            events: list[Event] = []
            if not started:
                started = True
                events.append(("start", None))
            for chunk in batch:
                ptids = chunk.get("prompt_token_ids")
                if ptids:
                    state.prompt_ids = ptids
                usage = chunk.get("usage")
                if usage:
                    state.take_usage(usage)
                choices = chunk.get("choices")
                if not choices:
                    continue
                choice = choices[0]
                tids = choice.get("token_ids")
                if tids:
                    if state.first_token_at is None:
                        state.first_token_at = time.time()
                    completion_ids.extend(tids)
                lp = choice.get("logprobs")
                if lp:
                    content = lp.get("content")
                    if content:
                        logprobs.extend([c["logprob"] for c in content])
                delta = choice.get("delta")
                if delta:
                    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                    if reasoning:
                        reasoning_parts.append(reasoning)
                        events.append(("reasoning", reasoning))
                    content = delta.get("content")
                    if content:
                        text.append(content)
                        events.append(("text", content))
                    for tc in delta.get("tool_calls") or ():
                        slot = pending.setdefault(tc.get("index", len(pending)), ["", "", ""])
                        if tc.get("id"):
                            slot[0] = tc["id"]
                        fn = tc.get("function") or {}
                        if fn.get("name"):
                            slot[1] += fn["name"]
                        if fn.get("arguments"):
                            slot[2] += fn["arguments"]
                finish = choice.get("finish_reason")
                if finish:
                    state.finish_reason = finish
            if len(events) == 1:
                yield events[0]
            elif events:
                yield ("batch", events)
        for index in sorted(pending):
            cid, name, args = pending[index]
            yield ("tool_call", record_tool_call(state, name, args, kinds, cid))
        self._finish(state)

    def _finish(self, state: CallState) -> None:
        if state.tool_calls:
            state.finish_reason = "tool_calls"
        elif state.finish_reason not in ("stop", "length", "tool_calls", "content_filter"):
            state.finish_reason = "stop" if state.finish_reason in (None, "eos", "abort") else state.finish_reason
        state.settle_usage()

    async def _from_response(self, data: dict[str, Any], state: CallState, kinds: dict[str, str]) -> AsyncIterator[Event]:
        state.prompt_ids = data.get("prompt_token_ids") or []
        state.take_usage(data.get("usage"))
        yield ("start", None)
        choices = data.get("choices") or []
        if not choices:
            raise ProxyError("engine_5xx", "engine returned no choices")
        choice = choices[0]
        state.completion_ids = choice.get("token_ids") or []
        state.first_token_at = time.time()
        lp = choice.get("logprobs")
        if lp and lp.get("content"):
            state.logprobs = [c["logprob"] for c in lp["content"]]
        msg = choice.get("message") or {}
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if reasoning:
            state.reasoning.append(reasoning)
            yield ("reasoning", reasoning)
        if msg.get("content"):
            state.text.append(msg["content"])
            yield ("text", msg["content"])
        state.finish_reason = choice.get("finish_reason")
        for tc in msg.get("tool_calls") or ():
            fn = tc.get("function") or {}
            yield ("tool_call", record_tool_call(state, fn.get("name", ""), fn.get("arguments", ""), kinds, tc.get("id", "")))
        self._finish(state)
