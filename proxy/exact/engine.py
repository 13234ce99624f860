"""`ExactTokenEngine`: the exact token-in implementation of the proxy's `TokenEngine` protocol.

Per call: splice the prompt ids (the session's served ids + render only the new messages), send
them as a token-id prompt to the engine's `/v1/completions` (`return_token_ids`, sampled-token
`logprobs`, streamed), parse the sampled text with the model family's parser as it arrives (content
and reasoning deltas at once, a tool call when complete), and remember the served call for the
session's next request. How the prompt was built goes to `splice_info(call_id)` for the capture log.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import orjson

from tracefleet.contract.capture import SpliceInfo
from tracefleet.contract.sampling import SamplingOverride
from tracefleet.formats.families import ModelFormat
from tracefleet.formats.parsers import Event as ParsedEvent, make_parser

from tracefleet.proxy.canonical import Conversation
from tracefleet.proxy.engine_client import EngineClient
from tracefleet.proxy.errors import ProxyError
from tracefleet.proxy.token_engine import (FALLBACK_MAX_TOKENS, CallState, Event, ServedModelName, canonical_finish,
                                           clamp_max_tokens, context_overflow, record_tool_call, sampling_record)
from tracefleet.proxy.exact.render import render_conversation
from tracefleet.proxy.exact.splice import SessionSplicer, SplicedPrompt

def _size(conv: Conversation) -> int:
    return sum(len(p.text or "") + len(p.arguments or "") for m in conv.messages for p in m.parts)


class ExactTokenEngine(ServedModelName):
    """Exact capture mode: the proxy renders and splices; the engine only sees token ids."""

    mode = "exact"
    guide: EngineClient | None = None  # answers guided calls (CallState.guided; the proxy's ProxyConfig.guide_url)

    def __init__(self, client: EngineClient, fmt: ModelFormat, served_model: str | None = None,
                 max_sessions: int = 4096, verify_full: bool = False,
                 job_sampling: SamplingOverride | None = None) -> None:
        self.verify_full = verify_full
        self.job_sampling = job_sampling or SamplingOverride()
        self.client = client
        self.fmt = fmt
        self._model = served_model
        self.sessions: OrderedDict[str, SessionSplicer] = OrderedDict()
        self.max_sessions = max_sessions
        self._splices: OrderedDict[str, SpliceInfo] = OrderedDict()
        self.stats = {"calls": 0, "spliced": 0, "new_roots": 0, "retries": 0, "reused_tokens": 0,
                      "rendered_tokens": 0, "parse_failures": 0, "drift_avoided": 0}
        self.new_root_reasons: dict[str, int] = {}

    def splicer(self, session_id: str) -> SessionSplicer:
        sp = self.sessions.get(session_id)
        if sp is None:
            sp = self.sessions[session_id] = SessionSplicer(self.fmt, verify_full=self.verify_full)
            while len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        else:
            self.sessions.move_to_end(session_id)
        return sp

    def splice_info(self, call_id: str) -> SpliceInfo | None:
        """How the call's prompt was built (taken once, for its capture record)."""
        return self._splices.pop(call_id, None)

    async def count_tokens(self, conv: Conversation) -> int:
        return len(self.fmt.encode(render_conversation(self.fmt, conv).text))

    def _body(self, conv: Conversation, model: str, prompt_ids: list[int], max_model_len: int | None,
              policy_version: int) -> dict[str, Any]:
        s = conv.sampling
        max_tokens = clamp_max_tokens(s.max_tokens, len(prompt_ids), max_model_len)
        body: dict[str, Any] = {
            "model": model, "prompt": prompt_ids, "return_token_ids": True,
            # never null: vLLM 0.11-0.20 answers a null with an empty 400, >= 0.24 stops at 16 tokens
            "max_tokens": FALLBACK_MAX_TOKENS if max_tokens is None else max_tokens,
            "logprobs": 0, "stream": True, "stream_options": {"include_usage": True},
            # keep tags a model marks special (<tool_call>, <think>) in the text the parser reads, as vLLM's
            # own tool/reasoning parsers do; the parser drops the end-of-turn text itself
            "skip_special_tokens": False,
        }
        eot = self.fmt.end_of_turn_id
        if eot is not None:
            # the splicer relies on a turn ending at the family's end-of-turn id, which vLLM stops on only when
            # generation_config.json lists it (not under --generation-config vllm, e.g. Gemma 3's <end_of_turn>)
            body["stop_token_ids"] = [eot]
        body.update(self.sampling_fields(s, policy_version))
        return body

    async def generate(self, conv: Conversation, state: CallState) -> AsyncIterator[Event]:
        splicer = self.splicer(state.session_id)
        try:
            if _size(conv) > 20_000:  # long histories: render + tokenize off the event loop
                spliced = await asyncio.to_thread(splicer.prompt, conv)
            else:
                spliced = splicer.prompt(conv)
        except ValueError as exc:  # TemplateError: the conversation does not fit the template
            raise ProxyError("invalid_request", str(exc)) from exc
        self._note_splice(state.call_id, spliced)
        state.prompt_ids = spliced.prompt_ids
        model = await self.served_model()
        state.engine_model = model
        limit = await self.max_model_len()
        if limit is not None and len(spliced.prompt_ids) >= limit:
            raise context_overflow(len(spliced.prompt_ids), limit)
        body = self._body(conv, model, spliced.prompt_ids, limit, state.policy_version)
        client = self.client
        if state.guided:
            if self.guide is None:
                raise ProxyError("invalid_request", "a guided call, but this proxy has no guide engine")
            # the guide serves its own model name: it is asked by none, and answers as its one model
            client, body["model"] = self.guide, None
            state.engine_model = None
        state.sampling = sampling_record(conv, body, self.job_sampling)
        state.logprobs_mode = self.logprobs_mode
        kinds = {t.name: t.kind for t in conv.tools}
        parser = make_parser(self.fmt.parser_name, spliced.rendered.tools, prompt_text=spliced.rendered.tail)
        state.engine_sent_at = time.time()
        started = False
        finish: str | None = None
        raw: list[str] = []
        eot_text = self.fmt.family.end_of_turn
        async for chunk in client.completions_stream(body):
            if not started:
                started = True
                yield ("start", None)
            state.take_usage(chunk.get("usage"))
            for choice in chunk.get("choices") or ():
                echoed = choice.get("prompt_token_ids")
                if echoed is not None and echoed != spliced.prompt_ids:
                    raise ProxyError("engine_5xx", "engine reports a prompt other than the token ids sent")
                tids = choice.get("token_ids")
                if tids:
                    if state.first_token_at is None:
                        state.first_token_at = time.time()
                    state.completion_ids.extend(tids)
                lp = choice.get("logprobs")
                if lp and lp.get("token_logprobs"):
                    state.logprobs.extend(float(x) for x in lp["token_logprobs"])
                text = choice.get("text") or ""
                if eot_text in text:  # skip_special_tokens is off: the stop token's text is layout, not output
                    text = text.replace(eot_text, "")
                if text:
                    raw.append(text)
                    for ev in self._events(parser.feed(text), kinds, state):
                        yield ev
                if choice.get("finish_reason"):
                    finish = state.finish_reason = choice["finish_reason"]
                    state.weight_versions = choice.get("weight_versions") or state.weight_versions
        outcome = canonical_finish(finish)  # aborted: an error, and the cut turn is never spliced
        for ev in self._events(parser.finish(), kinds, state):
            yield ev
        state.tool_parse_errors.extend(parser.errors)
        if parser.errors:
            self.stats["parse_failures"] += 1
        state.finish_reason = "tool_calls" if state.tool_calls else outcome
        state.settle_usage()
        out_calls = [(tc.name, tc.arguments if tc.kind == "function" else orjson.dumps({"input": tc.arguments}).decode())
                     for tc in state.tool_calls]
        splicer.record(state.call_id, spliced, state.completion_ids, state.output_text, out_calls)

    def _note_splice(self, call_id: str, spliced: SplicedPrompt) -> None:
        st = self.stats
        st["calls"] += 1
        info = spliced.info
        if spliced.retry_of is not None:
            st["retries"] += 1
        elif info.parent_call_id is not None:
            st["spliced"] += 1
        else:
            st["new_roots"] += 1
            reason = info.new_root_reason or "unknown"
            self.new_root_reasons[reason] = self.new_root_reasons.get(reason, 0) + 1
        st["reused_tokens"] += info.reused_tokens
        st["rendered_tokens"] += info.rendered_tokens
        full = spliced.checked_full_ids
        if full is not None and full != spliced.prompt_ids:
            st["drift_avoided"] += 1  # a re-render would have conditioned on other tokens
        self._splices[call_id] = info
        while len(self._splices) > 4096:
            self._splices.popitem(last=False)

    def _events(self, events: list[ParsedEvent], kinds: dict[str, str], state: CallState) -> list[Event]:
        out: list[Event] = []
        for ev in events:
            if ev.kind == "text":
                state.text.append(ev.text)
                out.append(("text", ev.text))
            elif ev.kind == "reasoning":
                state.reasoning.append(ev.text)
                out.append(("reasoning", ev.text))
            elif ev.call is not None:
                out.append(("tool_call", record_tool_call(state, ev.call.name, ev.call.arguments, kinds)))
        return out
