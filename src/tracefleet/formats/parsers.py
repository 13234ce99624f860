"""Sampled text → content, reasoning and tool calls, per model family, incrementally.

Every parser has the same shape: `feed(delta)` returns the events that are certain so far (content and
reasoning deltas as they arrive, a tool call once it is complete), `finish()` the rest. Text that could
still turn into a tag is held back, nothing else. The rules follow the engines' own parsers (vLLM's
`hermes`, `qwen3_coder`, `llama3_json`, and the `<think>` reasoning parser):

- `<think>…</think>` reasoning (Qwen3 / Qwen3.5); a prompt that already opened `<think>` starts in it.
- hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
- Qwen3-coder XML: `<tool_call><function=name><parameter=p>v</parameter></function></tool_call>`.
- Llama 3.x: the whole reply is JSON (`{"name": ..., "parameters": {...}}`, several joined by `;`),
  optionally after `<|python_tag|>`.

A tool call that does not parse is never dropped: its text is returned as content and the reason is
appended to `errors`, so the caller can flag the call (the evaluator fails it closed).

Where these rules differ from vLLM's parsers on purpose (read from vLLM v0.11 and v0.33's tool_parsers
and reasoning parsers; the token ids a trace records are the same in both modes, only the
message the harness is shown can differ; tests/exact/test_exact_parsers.py pins each difference):

- hermes, per call instead of all or nothing: vLLM returns no calls at all and the whole output as content
  when one `<tool_call>` body is bad JSON. Here the good calls still go out and the bad one becomes flagged
  text, so one malformed call neither hides the others nor passes unnoticed.
- hermes, text after the first call: vLLM keeps only the text before the first `<tool_call>` as content;
  here non-blank text between and after calls is content too (it was sampled; hiding it would show the
  harness less than the model said). Whitespace around calls is dropped, as vLLM does.
- hermes, argument spellings: `parameters` and double-encoded string arguments are accepted (vLLM needs an
  `arguments` key); both come from models trained on other templates.
- `<think>` (qwen3): reasoning only after `<think>` or when the prompt ends in it, and a `<tool_call>` inside
  reasoning stays reasoning. vLLM v0.33 starts in reasoning unless thinking is off and lets `<tool_call>`
  end it; v0.11 needs both tags. Output that never opens `<think>` is content here.
- qwen3_coder: a `<tool_call>` wrapper is required, and a parameter missing from the schema gets a JSON
  guess (vLLM v0.33 coerces by a fixed type order and accepts a bare `<function=`).
- llama3_json: a reply is a call only when it starts with `{` or `<|python_tag|>` (vLLM v0.11's rule);
  vLLM v0.33 searches every `{` in the text.
- Special-token text: exact mode asks vLLM for `skip_special_tokens: false` (as vLLM's own parsers do),
  so the text may carry the end-of-turn token's text; exact mode removes that before parsing (a special
  token arrives whole in one chunk's text).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

EventKind = Literal["text", "reasoning", "tool_call"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object
    raw: str = ""  # the sampled text of the call, for the log


@dataclass(frozen=True)
class Event:
    kind: EventKind
    text: str = ""
    call: ParsedCall | None = None


@dataclass
class ParseResult:
    content: str
    reasoning: str
    calls: list[ParsedCall]
    errors: list[str]


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _schema_types(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """tool name → {parameter: JSON-schema type}, from OpenAI-shaped or flat tool specs."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters") or fn.get("input_schema") or {}
        props = params.get("properties") if isinstance(params, dict) else None
        out[fn["name"]] = {k: (v or {}).get("type") for k, v in (props or {}).items() if isinstance(v, dict)}
    return out


def parse_json_call(body: str) -> tuple[ParsedCall | None, str | None]:
    """A hermes / Llama JSON call body → (call, None) or (None, why it does not parse)."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return None, f"tool call is not valid JSON ({exc.msg} at char {exc.pos})"
    if not isinstance(obj, dict):
        return None, "tool call JSON is not an object"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, "tool call JSON has no string 'name'"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models double-encode; accept only if it is an object inside
        try:
            inner = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None, f"tool call {name!r}: arguments string is not JSON"
        args = inner
    if not isinstance(args, dict):
        return None, f"tool call {name!r}: arguments are not a JSON object"
    return ParsedCall(name, json.dumps(args, ensure_ascii=False), body), None


_FUNCTION_RE = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAM_RE = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def _xml_value(raw: str, typ: Any) -> Any:
    # qwen3_coder strips one leading and trailing newline and converts by the schema's type
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    if typ == "string" or (isinstance(typ, list) and "string" in typ):
        return raw
    if typ is None and not raw.strip().startswith(("{", "[", '"')) and raw.strip() not in ("true", "false", "null") \
            and not re.fullmatch(r"-?\d+(\.\d+)?([eE][-+]?\d+)?", raw.strip()):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def parse_xml_call(body: str, types: dict[str, dict[str, Any]]) -> tuple[ParsedCall | None, str | None]:
    m = _FUNCTION_RE.search(body)
    if m is None:
        return None, "tool call has no complete <function=...>...</function> element"
    if body[:m.start()].strip() or body[m.end():].strip():
        return None, "unexpected text around <function=...> in tool call"
    name = m.group(1).strip()
    inner = m.group(2)
    args: dict[str, Any] = {}
    pos = 0
    for p in _PARAM_RE.finditer(inner):
        if inner[pos:p.start()].strip():
            return None, f"tool call {name!r}: unexpected text between parameters"
        key = p.group(1).strip()
        args[key] = _xml_value(p.group(2), types.get(name, {}).get(key))
        pos = p.end()
    if inner[pos:].strip():
        return None, f"tool call {name!r}: unterminated or malformed <parameter>"
    return ParsedCall(name, json.dumps(args, ensure_ascii=False), body), None


@dataclass
class _Base:
    tools: list[dict[str, Any]] | None = None
    errors: list[str] = field(default_factory=list)

    def parse(self, text: str) -> ParseResult:
        """Whole-text parse, by the same path as streaming."""
        events = self.feed(text) + self.finish()
        return collect(events, self.errors)

    def feed(self, delta: str) -> list[Event]:  # pragma: no cover - interface
        raise NotImplementedError

    def finish(self) -> list[Event]:  # pragma: no cover - interface
        raise NotImplementedError


def collect(events: list[Event], errors: list[str]) -> ParseResult:
    return ParseResult(
        content="".join(e.text for e in events if e.kind == "text"),
        reasoning="".join(e.text for e in events if e.kind == "reasoning"),
        calls=[e.call for e in events if e.kind == "tool_call" and e.call is not None],
        errors=list(errors),
    )


@dataclass
class TaggedParser(_Base):
    """`<think>` reasoning (optional) + `<tool_call>` blocks holding JSON (hermes) or XML (Qwen3-coder)."""

    reasoning: bool = False
    start_in_reasoning: bool = False
    buf: str = ""
    state: str = "content"  # content | reasoning | call
    n_calls: int = 0
    strip_lead: bool = False

    def __post_init__(self) -> None:
        self._types = _schema_types(self.tools)
        if self.reasoning and self.start_in_reasoning:
            self.state = "reasoning"

    def _call(self, body: str) -> tuple[ParsedCall | None, str | None]:
        stripped = body.strip()
        if stripped.startswith("<function="):
            return parse_xml_call(stripped, self._types)
        return parse_json_call(stripped)

    def feed(self, delta: str) -> list[Event]:
        self.buf += delta
        out: list[Event] = []
        while True:
            if self.state == "reasoning":
                end = self.buf.find(THINK_CLOSE)
                if end < 0:
                    keep = _partial_suffix(self.buf, THINK_CLOSE)
                    self._emit(out, "reasoning", self.buf[:len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    return out
                self._emit(out, "reasoning", self.buf[:end])
                self.buf = self.buf[end + len(THINK_CLOSE):]
                self.state = "content"
                self.strip_lead = True
                continue
            if self.state == "call":
                end = self.buf.find(CALL_CLOSE)
                if end < 0:
                    return out
                body, self.buf = self.buf[:end], self.buf[end + len(CALL_CLOSE):]
                self.state = "content"
                self._close_call(out, body, CALL_OPEN + body + CALL_CLOSE)
                continue
            if self.strip_lead:  # the newlines after </think> are the template's layout, not content
                self.buf = self.buf.lstrip("\n")
                if not self.buf:
                    return out
                self.strip_lead = False
            # content: look for the earliest opening tag
            tags = [CALL_OPEN] + ([THINK_OPEN] if self.reasoning and not self.n_calls else [])
            hits = [(self.buf.find(t), t) for t in tags if self.buf.find(t) >= 0]
            if hits:
                start, tag = min(hits)
                self._content(out, self.buf[:start])
                self.buf = self.buf[start + len(tag):]
                self.state = "call" if tag == CALL_OPEN else "reasoning"
                continue
            keep = max(_partial_suffix(self.buf, t) for t in tags)
            cut = len(self.buf) - keep
            text, self.buf = self.buf[:cut], self.buf[cut:]
            self._content(out, text, hold_whitespace=True)
            return out

    def _emit(self, out: list[Event], kind: EventKind, text: str) -> None:
        if text:
            out.append(Event(kind, text))

    def _content(self, out: list[Event], text: str, hold_whitespace: bool = False) -> None:
        # whitespace between or after calls is formatting, not content (vLLM's hermes parser agrees)
        if self.n_calls and not text.strip():
            if hold_whitespace:
                self.buf = text + self.buf
            return
        self._emit(out, "text", text)

    def _close_call(self, out: list[Event], body: str, raw: str) -> None:
        call, why = self._call(body)
        if call is None:
            self.errors.append(f"{why}: {raw[:200]!r}")
            out.append(Event("text", raw))
            return
        self.n_calls += 1
        out.append(Event("tool_call", call=ParsedCall(call.name, call.arguments, raw)))

    def finish(self) -> list[Event]:
        out: list[Event] = []
        rest, self.buf = self.buf, ""
        if self.state == "reasoning":
            self._emit(out, "reasoning", rest)  # cut off while thinking: all of it was reasoning
        elif self.state == "call":
            # EOS before </tool_call>: a complete body still counts (vLLM does the same); else flag it
            call, why = self._call(rest)
            if call is None:
                self.errors.append(f"unterminated tool call ({why}): {(CALL_OPEN + rest)[:200]!r}")
                out.append(Event("text", CALL_OPEN + rest))
            else:
                self.n_calls += 1
                out.append(Event("tool_call", call=ParsedCall(call.name, call.arguments, CALL_OPEN + rest)))
        elif rest and not (self.n_calls and not rest.strip()) and not self.strip_lead:
            out.append(Event("text", rest))
        self.state = "content"
        return out


@dataclass
class Llama3JsonParser(_Base):
    """Llama 3.x: a reply that starts with `{` (or `<|python_tag|>`) is one or more JSON tool calls."""

    buf: str = ""
    mode: str = "undecided"  # undecided | text | json

    def feed(self, delta: str) -> list[Event]:
        self.buf += delta
        if self.mode == "text":
            out, self.buf = self.buf, ""
            return [Event("text", out)] if out else []
        if self.mode == "undecided":
            head = self.buf.lstrip()
            if not head or PYTHON_TAG.startswith(head):
                return []
            if head.startswith(PYTHON_TAG) or head.startswith("{"):
                self.mode = "json"
                return []
            self.mode = "text"
            out, self.buf = self.buf, ""
            return [Event("text", out)]
        return []  # json: a call is complete only at the end of the reply

    def finish(self) -> list[Event]:
        rest, self.buf = self.buf, ""
        if self.mode != "json":
            return [Event("text", rest)] if rest else []
        body = rest.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):].strip()
        calls: list[ParsedCall] = []
        dec = json.JSONDecoder()
        pos = 0
        why: str | None = None
        while pos < len(body):
            try:
                _, end = dec.raw_decode(body, pos)
            except json.JSONDecodeError as exc:
                why = f"tool call is not valid JSON ({exc.msg} at char {exc.pos})"
                break
            call, why = parse_json_call(body[pos:end])
            if call is None:
                break
            calls.append(call)
            pos = end
            while pos < len(body) and body[pos] in " \n\t;":
                pos += 1
        if why is not None:
            if body.lstrip().startswith('{"name"') or body.startswith("{\"type\"") or rest.lstrip().startswith(PYTHON_TAG):
                self.errors.append(f"{why}: {rest[:200]!r}")
            return [Event("text", rest)]  # JSON-looking text that is not a call stays content
        return [Event("tool_call", call=c) for c in calls]


FAMILY_PARSERS = {
    "hermes": dict(kind="tagged", reasoning=False),
    "chatml": dict(kind="tagged", reasoning=False),
    "gemma3": dict(kind="tagged", reasoning=False),
    "qwen3": dict(kind="tagged", reasoning=True),
    "qwen3_coder": dict(kind="tagged", reasoning=True),
    "llama3": dict(kind="llama3"),
}


def make_parser(family: str, tools: list[dict[str, Any]] | None = None, *, prompt_text: str = "",
                reasoning: bool | None = None) -> TaggedParser | Llama3JsonParser:
    """The output parser for a family. `prompt_text` (the rendered prompt's tail is enough) tells whether
    the generation prompt already opened `<think>`."""
    spec = FAMILY_PARSERS.get(family)
    if spec is None:
        raise ValueError(f"unknown model family {family!r}; known: {sorted(FAMILY_PARSERS)}")
    if spec["kind"] == "llama3":
        return Llama3JsonParser(tools=tools)
    think = spec["reasoning"] if reasoning is None else reasoning
    tail = prompt_text.rstrip()
    opened = think and tail.endswith(THINK_OPEN)
    return TaggedParser(tools=tools, reasoning=think, start_in_reasoning=opened)


def parse_output(family: str, text: str, tools: list[dict[str, Any]] | None = None, *,
                 prompt_text: str = "") -> ParseResult:
    return make_parser(family, tools, prompt_text=prompt_text).parse(text)
