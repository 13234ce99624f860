"""Per-session splicing: reuse the exact token ids already served, render only what is new.

A served call is remembered as (the prompt's messages, the assistant message it produced, prompt ids,
completion ids). A new request matches a served call when its messages start with that call's prompt
messages followed by that call's output, compared as *meaning*, not bytes: tool-call arguments as
parsed JSON, text compared without whitespace, tool-call ids and echoed reasoning ignored (harnesses
re-serialise arguments, collapse text blocks, move cache markers, echo or strip reasoning). The longest
match wins. The prompt is then

    served prompt ids + served completion ids + ids of (template text after that turn's end token)

where the cut is placed right after the end-of-turn special token that closes the matched assistant
turn, counted in the full render, so the template may rewrite earlier turns (Qwen3 drops old
reasoning) without moving the cut. The cut is checked every time on the window from that end-of-turn
token on (the special token must stay one token and the suffix must tokenize the same after it), and
with `verify_full` against the ids of the whole render; if not, the call starts a new root
("boundary_mismatch").

No match → the full render, a new root, with the reason: new_conversation, auxiliary (no tools offered
where the agent's conversation offers them: a title or summary request), sub_agent (different system
prompt than the agent's conversation), compaction (shorter history that keeps the start), rewritten_history.
"""

from __future__ import annotations

import json
import re
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from tracefleet.contract.semantics import AUXILIARY
from tracefleet.contract.capture import SpliceInfo
from tracefleet.formats.families import ModelFormat

from tracefleet.proxy.canonical import Conversation
from tracefleet.proxy.exact.render import Rendered, render_conversation

ToolCallKey = tuple[str | None, str]  # (name, arguments as sorted JSON)
Key = tuple[str | None, str, tuple[ToolCallKey, ...]]  # (role, text without whitespace, tool calls)
_WS = re.compile(r"\s+")


def _norm_text(text: str | list[dict[str, Any]] | None) -> str:
    if isinstance(text, list):  # content parts (images): text and URLs in order
        text = "".join(p.get("text") or (p.get("image_url") or {}).get("url", "") for p in text if isinstance(p, dict))
    # all whitespace out: a block list joined with or without separators is the same message
    return _WS.sub("", text or "")


def _norm_args(args: str | dict[str, Any] | None) -> str:
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return _norm_text(args)
    return json.dumps(args, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def message_key(msg: dict[str, Any]) -> Key:
    """What must agree for a message to count as already served (template-message dict shape)."""
    role = msg.get("role")
    calls = tuple((c.get("function", {}).get("name"), _norm_args(c.get("function", {}).get("arguments")))
                  for c in msg.get("tool_calls") or ())
    return (role, _norm_text(msg.get("content")), calls)


def tools_key(tools: list[dict[str, Any]] | None) -> str:
    return json.dumps(tools or [], sort_keys=True, ensure_ascii=False)


NO_TOOLS = tools_key(None)


def output_key(text: str, calls: list[tuple[str, str]]) -> Key:
    return ("assistant", _norm_text(text), tuple((n, _norm_args(a)) for n, a in calls))


@dataclass
class ServedCall:
    call_id: str
    parent_call_id: str | None
    keys: list[Key]  # the prompt's messages
    out_key: Key  # the assistant message it produced
    served: array  # prompt ids + completion ids, 4 bytes a token (sessions keep many long prompts)
    prompt_len: int
    ended_with_eot: bool
    system: str | None
    tools_key: str = ""


@dataclass
class SplicedPrompt:
    prompt_ids: list[int]
    info: SpliceInfo
    rendered: Rendered
    keys: list[Key]
    tools_key: str = ""
    retry_of: str | None = None
    checked_full_ids: list[int] | None = None  # the full render's ids (when computed), for drift stats


@dataclass
class SessionSplicer:
    fmt: ModelFormat
    max_calls: int = 256
    verify_full: bool = False  # also tokenize the whole render each call and check the cut against it
    calls: OrderedDict[str, ServedCall] = field(default_factory=OrderedDict)

    # -- splicing ------------------------------------------------------------------------------

    def prompt(self, conv: Conversation) -> SplicedPrompt:
        r = render_conversation(self.fmt, conv)
        keys = [message_key(m) for m in r.messages]
        tk = tools_key(r.tools)
        best: tuple[int, ServedCall, bool] | None = None  # (matched messages, call, is_retry)
        tools_changed = False
        for call in reversed(self.calls.values()):
            n = len(call.keys)
            if call.tools_key != tk:  # the tool list is rendered into the prompt: a different one is another prompt
                tools_changed = tools_changed or keys[:n] == call.keys
                continue
            if len(keys) > n and keys[:n] == call.keys and keys[n] == call.out_key:
                if best is None or n + 1 > best[0]:
                    best = (n + 1, call, False)
            elif keys == call.keys and (best is None or n > best[0]):
                best = (n, call, True)
        if best is not None:
            matched, call, retry = best
            if retry:  # same prompt again: a sibling of the first attempt, not its child
                info = SpliceInfo(parent_call_id=call.parent_call_id, reused_tokens=call.prompt_len,
                                  matched_messages=matched)
                return SplicedPrompt(call.served[:call.prompt_len].tolist(), info, r, keys, tk, retry_of=call.call_id)
            if matched < len(keys):
                spliced = self._extend(conv, r, keys, call, matched)
                if spliced is not None:
                    return spliced
                reason = "boundary_mismatch"
            else:
                reason = "ends_with_assistant"
        else:
            reason = "tools_changed" if tools_changed else self._why_new_root(keys, r)
        ids = self.fmt.encode(r.text)
        return SplicedPrompt(ids, SpliceInfo(rendered_tokens=len(ids), new_root_reason=reason), r, keys, tk,
                    checked_full_ids=ids if self.verify_full else None)

    def _extend(self, conv: Conversation, r: Rendered, keys: list[Key], call: ServedCall, matched: int) -> SplicedPrompt | None:
        eot = self.fmt.family.end_of_turn
        history = self.fmt.render(r.messages[:matched], r.tools, add_generation_prompt=False, **r.kwargs)
        n_turn_ends = history.count(eot)
        if n_turn_ends == 0:
            return None
        cut = _nth_end(r.text, eot, n_turn_ends)
        if cut is None:
            return None
        glue = history[history.rindex(eot) + len(eot):]
        if not r.text.startswith(glue, cut):
            return None
        eot_start = cut - len(eot)
        start = cut if call.ended_with_eot else eot_start  # stopped by length or a stop string: close the turn
        suffix = self.fmt.encode(r.text[start:])
        eot_id = self.fmt.end_of_turn_id
        # The cut sits at a special token, so no token can straddle it: tokenizing from the end-of-turn token
        # on must give that token and then exactly the suffix (checked on this window only: O(new tokens)).
        window = self.fmt.encode(r.text[eot_start:])
        if not suffix or eot_id is None or window != ([eot_id] + suffix if call.ended_with_eot else suffix):
            return None
        full = None
        if self.verify_full:  # tests and audits: the suffix is exactly the tail of a full render's ids
            full = self.fmt.encode(r.text)
            if full[len(full) - len(suffix):] != suffix or self.fmt.encode(r.text[:start]) != full[:len(full) - len(suffix)]:
                return None
        reused = call.served.tolist()
        info = SpliceInfo(parent_call_id=call.call_id, reused_tokens=len(reused), rendered_tokens=len(suffix),
                          matched_messages=matched)
        return SplicedPrompt(reused + suffix, info, r, keys, tools_key(r.tools), checked_full_ids=full)

    def _shared_keys(self, spliced: SplicedPrompt) -> list[Key]:
        """The prompt's message keys, each one its parent call's own object where they agree: a long session's
        calls then share one copy of each message's text instead of holding one each (measured by
        bench/sidecar.py: 300 turns growing by 1.5 kB held ~60 MiB of duplicate keys)."""
        parent = self.calls.get(spliced.info.parent_call_id or "") if spliced.info.parent_call_id else None
        if parent is None and self.calls:
            parent = next(reversed(self.calls.values()))
        if parent is None:
            return spliced.keys
        history = [*parent.keys, parent.out_key]
        keys = list(spliced.keys)
        for i in range(min(len(keys), len(history))):
            if keys[i] != history[i]:
                break
            keys[i] = history[i]
        return keys

    def _why_new_root(self, keys: list[Key], r: Rendered) -> str:
        # Calls beside the agent's conversation (no tools offered where the conversation offers them: a
        # title or summary request) are auxiliary, and are no reason to call the conversation a sub-agent.
        agent = [c for c in self.calls.values() if c.tools_key != NO_TOOLS]
        if agent and not r.tools:
            return AUXILIARY
        peers = agent if r.tools else list(self.calls.values())
        if not peers:
            return "new_conversation"
        system = keys[0][1] if keys and keys[0][0] == "system" else None
        longest = 0
        common = 0
        for call in peers:
            hist = call.keys + [call.out_key]
            longest = max(longest, len(hist))
            n = 0
            while n < min(len(hist), len(keys)) and hist[n] == keys[n]:
                n += 1
            common = max(common, n)
        if common == 0:
            if system is not None and all(c.system is not None and c.system != system for c in peers):
                return "sub_agent"
            return "new_conversation"
        if len(keys) < longest:
            return "compaction"
        return "rewritten_history"

    # -- recording -------------------------------------------------------------------------------

    def record(self, call_id: str, spliced: SplicedPrompt, completion_ids: list[int], text: str,
               calls: list[tuple[str, str]]) -> ServedCall:
        eot_id = self.fmt.end_of_turn_id
        served = ServedCall(
            call_id=call_id,
            parent_call_id=spliced.info.parent_call_id,
            keys=self._shared_keys(spliced),
            out_key=output_key(text, calls),
            served=array("i", spliced.prompt_ids + list(completion_ids)),
            prompt_len=len(spliced.prompt_ids),
            ended_with_eot=bool(completion_ids) and completion_ids[-1] == eot_id,
            system=spliced.keys[0][1] if spliced.keys and spliced.keys[0][0] == "system" else None,
            tools_key=spliced.tools_key,
        )
        self.calls[call_id] = served
        while len(self.calls) > self.max_calls:
            self.calls.popitem(last=False)
        return served


def _nth_end(text: str, tag: str, n: int) -> int | None:
    pos = -1
    for _ in range(n):
        pos = text.find(tag, pos + 1)
        if pos < 0:
            return None
    return pos + len(tag)
