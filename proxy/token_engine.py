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

from tracefleet.contract.capture import SpliceInfo
from tracefleet.contract.engine_limits import LOGPROBS_MODES, UNKNOWN_LOGPROBS
from tracefleet.contract.sampling import JOB_SOURCE, SamplingOverride
from tracefleet.vllm import version_tuple

from tracefleet.proxy.canonical import Conversation, Message, Sampling, ToolCall
from tracefleet.proxy.engine_client import EngineClient, is_max_tokens_error
from tracefleet.proxy.errors import ProxyError

Event = tuple[str, Any]

# capture-record flag: len(completion_ids), usage.completion_tokens and len(logprobs) disagree
TOKEN_COUNT_MISMATCH = "token_count_mismatch"
SAMPLING_KEYS = ("temperature", "top_p", "top_k")
WEIGHT_VERSIONS_SINCE = (0, 33)  # first vLLM whose completions/chat answer `return_weight_versions`

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
    # the sampling parameters the engine was asked for, each with where it came from (sampling_record)
    sampling: dict[str, Any] | None = None
    # what kind the logprobs are: processed_logprobs | raw_logprobs | unknown (tracefleet.contract.engine_limits)
    logprobs_mode: str | None = None
    flags: list[str] = field(default_factory=list)  # what makes the record suspect (TOKEN_COUNT_MISMATCH, ...)
    # vLLM's [{version, start, end}] spans over the output tokens, where it reports them (v0.33 with
    # return_weight_versions; v0.32 only on /inference/v1/generate): which weights sampled which tokens
    weight_versions: list[dict[str, Any]] | None = None
    guided: bool = False  # answered by the session's guide engine, not the policy (CaptureRecord.guided)

    def take_usage(self, usage: dict[str, Any] | None) -> None:
        """The engine's own token counts, when a response or stream chunk carries them."""
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens", 0)
            self.completion_tokens = usage.get("completion_tokens", 0)

    def settle_usage(self) -> None:
        """Counts the engine did not report are the lengths of the ids recorded for the call; when it did
        report them, the recorded ids and logprobs must agree with its count (vLLM < 0.13 silently dropped
        streamed chunks a parser held back): a call where they do not is flagged, not trusted.

        Run for every record, whatever ended the call (done, cut by a time limit, abandoned, shut down): an
        engine reports usage only with its last chunk, so a cut call's counts are its ids'. Idempotent."""
        reported = self.completion_tokens
        self.prompt_tokens = self.prompt_tokens or len(self.prompt_ids)
        self.completion_tokens = reported or len(self.completion_ids)
        if ((reported and reported != len(self.completion_ids)) or len(self.logprobs) != len(self.completion_ids)) \
                and TOKEN_COUNT_MISMATCH not in self.flags:
            self.flags.append(TOKEN_COUNT_MISMATCH)

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
            # vLLM >= 0.12 gives templates both names (0.33 reads `reasoning`, older ones `reasoning_content`)
            m["reasoning"] = m["reasoning_content"] = reasoning
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


def canonical_finish(reason: str | None) -> str:
    """vLLM's finish_reason (`stop`, `length`, `abort`, `error`, `repetition`) as the canonical one, or the
    call's error. `abort` (a `/pause?mode=abort` for a weight sync, an admin abort) is a retryable call
    error: the turn is cut short, so it must never reach the harness or the trace as a finished one.
    `error` is the engine failing mid-generation. `repetition` (vLLM's repetition detector stopped a looping
    output) is a cut-off turn: `length` to the harness, as a max_tokens cut is."""
    if reason == "abort":
        raise ProxyError("engine_aborted", "the engine aborted the generation (paused for a policy update?); retry",
                         retry_after=1)
    if reason == "error":
        raise ProxyError("engine_5xx", "the engine failed during generation (finish_reason 'error')")
    if reason in ("length", "repetition"):
        return "length"
    return "stop"


def sampling_record(conv: Conversation, body: dict[str, Any], job: SamplingOverride | None = None) -> dict[str, Any]:
    """The sampling parameters as sent to the engine (`body`) and where each came from: `job` (the job's
    spec.inference.sampling replaced the harness's), `request` (the harness set it), `proxy` (the proxy chose
    it: a max_tokens clamped to the context's room) or `engine_default` (not sent: vLLM fills it from the
    model's generation_config.json, the tracefleet engine from its flags). With the call's logprobs_mode they
    say which distribution sampled and what its logprobs are (vLLM's raw logprobs are taken before
    temperature/top-p/top-k)."""
    s = conv.sampling
    stated = job.fields() if job is not None else {}
    out: dict[str, Any] = {}
    for key in (*SAMPLING_KEYS, "seed", "max_tokens"):
        value = body.get(key)
        source = ("engine_default" if value is None else JOB_SOURCE if key in stated
                  else "request" if value == getattr(s, key) else "proxy")
        out[key] = {"value": value, "source": source}
    return out


def engine_logprobs_mode(client: EngineClient, card: dict[str, Any]) -> str:
    """The kind of logprobs an engine reports: as stated to the proxy (a managed vLLM's from the arguments it
    runs with, the user for an external one), else as the engine's model card says (`logprobs_mode`, where an
    engine reports it: vLLM's does not), else unknown. vLLM shows its configuration only on /server_info, in dev
    mode, and builds a system report for it first (vLLM 0.32's collect_env, measured here: tens of seconds of
    CPU, ending in an AttributeError): not asked on a call's path."""
    said = client.logprobs_mode or card.get("logprobs_mode")
    return said if said in LOGPROBS_MODES else UNKNOWN_LOGPROBS


def reasoning_template_kwargs(effort: str | None) -> dict[str, Any]:
    """Chat-template variables for a reasoning effort, as vLLM (v0.33) derives them: `reasoning_effort`,
    and `enable_thinking` false only for "none". Both capture modes render with these."""
    if effort is None:
        return {}
    return {"reasoning_effort": effort, "enable_thinking": effort != "none"}


def cache_salt(policy_version: int) -> str:
    """vLLM's prefix-cache salt for a call: KV computed under one policy version's weights is never reused
    by a call admitted under another (vLLM keys cached blocks by the salt)."""
    return f"policy-{policy_version}"


def clamp_max_tokens(requested: int | None, prompt_len: int, max_model_len: int | None) -> int | None:
    """The max_tokens to send: the harness's, clamped to the room the prompt leaves in the context; all of
    that room when it asked for none. None only when the room is unknown and nothing was asked for."""
    if max_model_len is None:
        return requested
    room = max(1, max_model_len - prompt_len)
    return room if requested is None else max(0, min(requested, room))


# The output budget exact mode sends when the engine reports no max_model_len and the harness gave none:
# never null (vLLM 0.11-0.20: an empty 400; >= 0.24: 16 tokens).
FALLBACK_MAX_TOKENS = 4096


def context_overflow(prompt_len: int, max_model_len: int) -> ProxyError:
    """A prompt with no room left for output, in the words of vLLM's own 400."""
    return ProxyError("context_length", f"prompt exceeds the model's context length: This model's maximum context "
                      f"length is {max_model_len} tokens. However, your request has {prompt_len} input tokens. "
                      "Please reduce the length of the input messages.")


class ServedModelName:
    """Mixin for token engines: the configured model name, else the first one the engine lists, and the
    engine's `max_model_len` (vLLM's model card; None when the engine reports none). Asked once."""

    client: EngineClient
    _model: str | None
    _max_model_len: int | None = None
    _cards_read: bool = False
    logprobs_mode: str = UNKNOWN_LOGPROBS  # settled when the cards are read (engine_logprobs_mode)
    # vLLM v0.33 reports which weights sampled which tokens (`return_weight_versions`); earlier releases and
    # other engines are not asked (an unknown field costs a warning per request in vLLM's log)
    reports_weight_versions: bool = False
    job_sampling: SamplingOverride = SamplingOverride()  # the job's, replacing the harness's (contract.sampling)

    def sampling_fields(self, s: Sampling, policy_version: int) -> dict[str, Any]:
        """What either capture mode asks the engine about sampling and the policy: the harness's sampling keys
        (each the job states replaced) and stop strings, the prefix cache salted by the policy version, per-token
        weight versions where reported."""
        fields: dict[str, Any] = {key: getattr(s, key) for key in (*SAMPLING_KEYS, "seed")
                                  if getattr(s, key) is not None}
        fields.update(self.job_sampling.fields())
        if s.stop:
            fields["stop"] = s.stop
        fields["cache_salt"] = cache_salt(policy_version)
        if self.reports_weight_versions:
            fields["return_weight_versions"] = True
        return fields

    async def _read_cards(self) -> None:
        # when the proxy started before the engine, this is the first look at its version
        version = await self.client.check_version()
        self.reports_weight_versions = bool(version) and version_tuple(version or "") >= WEIGHT_VERSIONS_SINCE
        cards = await self.client.model_cards()
        if not cards and self._model is None:
            raise ProxyError("engine_5xx", "engine serves no model")
        if self._model is None:
            self._model = str(cards[0]["id"])
        card = next((c for c in cards if c.get("id") == self._model), cards[0] if cards else {})
        limit = card.get("max_model_len")
        self._max_model_len = limit if isinstance(limit, int) and limit > 0 else None
        self.logprobs_mode = engine_logprobs_mode(self.client, card)
        self._cards_read = True

    async def served_model(self) -> str:
        if self._model is None or not self._cards_read:
            await self._read_cards()
        assert self._model is not None
        return self._model

    async def max_model_len(self) -> int | None:
        if not self._cards_read:
            await self._read_cards()
        return self._max_model_len


class ServerTokenEngine(ServedModelName):
    """Server capture mode: the engine renders the prompt; we record its ids."""

    mode = "server"

    def __init__(self, client: EngineClient, served_model: str | None = None,
                 job_sampling: SamplingOverride | None = None) -> None:
        self.client = client
        self._model = served_model
        self.job_sampling = job_sampling or SamplingOverride()

    def splice_info(self, call_id: str) -> SpliceInfo | None:
        return None  # the engine renders the prompt; drift is found when traces are built

    async def _body(self, conv: Conversation, stream: bool, policy_version: int = 0) -> dict[str, Any]:
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
            # the prompt is at least one token: never more than the context leaves (vLLM 400s otherwise)
            body["max_tokens"] = clamp_max_tokens(s.max_tokens, 1, await self.max_model_len())
        body.update(self.sampling_fields(s, policy_version))
        kwargs = reasoning_template_kwargs(s.reasoning_effort)
        if kwargs:
            # the same template variables exact mode renders with; vLLM's own `reasoning_effort` field takes
            # only OpenAI's levels (an Anthropic thinking budget would be a 400)
            body["chat_template_kwargs"] = kwargs
            if s.reasoning_effort in ("low", "medium", "high"):
                body["reasoning_effort"] = s.reasoning_effort
        return body

    async def _clamped(self, conv: Conversation, body: dict[str, Any]) -> dict[str, Any]:
        """The body again with max_tokens clamped to the room the rendered prompt leaves (asked of the
        engine's /tokenize): after vLLM (< 0.33) refused prompt + max_tokens > max_model_len."""
        limit = await self.max_model_len()
        prompt_len = await self.count_tokens(conv)
        if limit is not None and prompt_len >= limit:
            raise context_overflow(prompt_len, limit)
        return {**body, "max_tokens": clamp_max_tokens(conv.sampling.max_tokens, prompt_len, limit)}

    async def count_tokens(self, conv: Conversation) -> int:
        body: dict[str, Any] = {"model": await self.served_model(), "messages": engine_messages(conv)}
        if conv.tools:
            body["tools"] = engine_tools(conv)
        kwargs = reasoning_template_kwargs(conv.sampling.reasoning_effort)
        if kwargs:
            body["chat_template_kwargs"] = kwargs
        data = await self.client.tokenize(body)
        return int(data.get("count", len(data.get("tokens", []))))

    async def generate(self, conv: Conversation, state: CallState) -> AsyncIterator[Event]:
        body = await self._body(conv, conv.stream, state.policy_version)
        state.engine_model = body["model"]
        state.sampling = sampling_record(conv, body, self.job_sampling)
        state.logprobs_mode = self.logprobs_mode
        state.engine_sent_at = time.time()
        kinds = {t.name: t.kind for t in conv.tools}
        if not conv.stream:
            try:
                data = await self.client.chat(body)
            except ProxyError as err:
                if not is_max_tokens_error(err):
                    raise
                body = await self._clamped(conv, body)
                state.sampling = sampling_record(conv, body, self.job_sampling)
                data = await self.client.chat(body)
            async for ev in self._from_response(data, state, kinds):
                yield ev
            return
        try:
            async for ev in self._stream(body, state, kinds):
                yield ev
        except ProxyError as err:
            if not is_max_tokens_error(err) or state.completion_ids:
                raise
            body = await self._clamped(conv, body)
            state.sampling = sampling_record(conv, body, self.job_sampling)
            async for ev in self._stream(body, state, kinds):
                yield ev

    async def _stream(self, body: dict[str, Any], state: CallState, kinds: dict[str, str]) -> AsyncIterator[Event]:
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
                    state.weight_versions = choice.get("weight_versions") or state.weight_versions
            if len(events) == 1:
                yield events[0]
            elif events:
                yield ("batch", events)
        finish = canonical_finish(state.finish_reason)  # an aborted call raises before its tool calls go out
        for index in sorted(pending):
            cid, name, args = pending[index]
            yield ("tool_call", record_tool_call(state, name, args, kinds, cid))
        self._finish(state, finish)

    def _finish(self, state: CallState, finish: str) -> None:
        state.finish_reason = "tool_calls" if state.tool_calls else finish
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
        state.finish_reason = choice.get("finish_reason")
        state.weight_versions = choice.get("weight_versions")
        finish = canonical_finish(state.finish_reason)  # an aborted call is an error, nothing is answered
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if reasoning:
            state.reasoning.append(reasoning)
            yield ("reasoning", reasoning)
        if msg.get("content"):
            state.text.append(msg["content"])
            yield ("text", msg["content"])
        for tc in msg.get("tool_calls") or ():
            fn = tc.get("function") or {}
            yield ("tool_call", record_tool_call(state, fn.get("name", ""), fn.get("arguments", ""), kinds, tc.get("id", "")))
        self._finish(state, finish)
