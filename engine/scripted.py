"""The scripted backend: deterministic replies for harness tests, with real token ids.

A harness test needs an engine that behaves like a model that uses tools: it calls a tool the
request offers (a shell, preferably, running a harmless command), reads the result, calls again,
and then answers in text. `Script` is that behaviour as data; harness tests tune it per harness.
The reply is written in the model's own raw format (hermes `<tool_call>{json}</tool_call>` after
`<|im_start|>assistant\\n`), tokenized with the model's real tokenizer, and ended with the
end-of-turn token, so token ids, rendering and parsing go through exactly the paths a real model's
output takes. Logprobs are deterministic stand-ins (a scripted reply has no distribution).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any, Iterator

from pydantic import BaseModel, Field

from tracefleet.engine.backend import ChatContext, GenerationRequest, PromptLogprob, SampledToken
from tracefleet.formats.shell_tools import COMMAND_KEYS, SHELL_SUBSTRINGS
from tracefleet.formats.tokenizer import Tokenizer

# Names of shell-like tools across the harnesses, best first; then SHELL_SUBSTRINGS (formats.shell_tools).
DEFAULT_TOOL_PREFERENCE = [
    "shell", "exec_command", "bash", "Bash", "run_shell_command", "local_shell", "execute_command",
    "run_command", "run_terminal_cmd", "terminal", "exec",
]


class ScriptStep(BaseModel):
    """One tool-call round. `tools`: names to try, in order (first one the request offers wins; empty =
    the default preference). `arguments`: the call's arguments; strings may contain `{command}` and
    `{round}`. None = arguments derived from the tool's JSON schema. `text`: content before the call."""

    tools: list[str] = Field(default_factory=list)
    arguments: dict[str, Any] | None = None
    text: str = ""


class ScriptRoute(BaseModel):
    """Another plan for conversations whose messages contain `marker` (e.g. a tag in a task's prompt), so
    one engine can drive different sessions of a job differently: one round per step (a named tool with its
    arguments: a harness's own tools), else one shell round per command, then `final_text`. Neither: the
    reply is the final text at once (a claim with no work done)."""

    marker: str
    commands: list[str] = Field(default_factory=list)
    steps: list[ScriptStep] = Field(default_factory=list)
    final_text: str | None = None
    first_token_delay_s: float | None = None  # holds these conversations' calls (a session held open mid-way)


class Script(BaseModel):
    tool_rounds: int = 2  # K: answer with a tool call while the conversation has fewer than K tool results
    steps: list[ScriptStep] = Field(default_factory=list)  # step i is used for round i (when present)
    tool_preference: list[str] = Field(default_factory=lambda: list(DEFAULT_TOOL_PREFERENCE))
    argument_templates: dict[str, dict[str, Any]] = Field(default_factory=dict)  # per tool name
    commands: list[str] = Field(default_factory=lambda: ["echo tracefleet > note.txt", "ls"])  # round i: i % len
    final_text: str = "Done. I wrote note.txt and listed the directory."
    no_tools_text: str = "Hello from the tracefleet scripted engine."  # when no tools are offered
    token_delay_s: float = 0.0  # sleep before each token (streaming and fault tests)
    first_token_delay_s: float = 0.0
    routes: list[ScriptRoute] = Field(default_factory=list)  # first route whose marker the conversation holds

    def routed(self, conversation: str) -> Script:
        """The script for a conversation: a matching route's commands and final text, else this one."""
        for route in self.routes:
            if route.marker in conversation:
                rounds = len(route.steps) if route.steps else len(route.commands)
                delay = self.first_token_delay_s if route.first_token_delay_s is None else route.first_token_delay_s
                return self.model_copy(update={"commands": route.commands, "steps": route.steps, "tool_rounds": rounds,
                                               "final_text": route.final_text or self.final_text, "routes": [],
                                               "first_token_delay_s": delay})
        return self


@dataclass
class Decision:
    text: str  # the raw completion text (without the end-of-turn token)
    round: int
    tool: str | None


def tool_name(tool: dict[str, Any]) -> str | None:
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else None


def tool_schema(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    for key in ("parameters", "input_schema", "parametersJsonSchema"):
        if isinstance(fn.get(key), dict):
            return fn[key]
    return {}


def choose_tool(tools: list[dict[str, Any]], candidates: list[str], preference: list[str]) -> dict[str, Any] | None:
    by_name = {tool_name(t): t for t in tools if tool_name(t)}
    for name in candidates:
        if name in by_name:
            return by_name[name]
    if candidates:
        return None  # the step named its tools; none is offered → no call
    for name in preference:
        if name in by_name:
            return by_name[name]
    for sub in SHELL_SUBSTRINGS:
        for name, tool in by_name.items():
            if sub in name.lower():
                return tool
    return next(iter(by_name.values()), None)


def _value_for(key: str, schema: dict[str, Any], command: str) -> Any:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if "enum" in schema and schema["enum"]:
        return schema["enum"][0]
    low = key.lower()
    if kind == "array":
        if low in COMMAND_KEYS:
            return ["bash", "-lc", command]
        return []
    if kind in ("integer", "number"):
        return 10000 if "timeout" in low else 1
    if kind == "boolean":
        return False
    if kind == "object":
        return {}
    if low in COMMAND_KEYS:
        return command
    if "path" in low or "file" in low:
        return "note.txt"
    if "description" in low:
        return "Run a shell command"
    if "content" in low:
        return "tracefleet\n"
    return "tracefleet"


def schema_arguments(schema: dict[str, Any], command: str) -> dict[str, Any]:
    """Arguments that satisfy the schema's required properties (and any command-like one)."""
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    args = {}
    for key, sub in props.items():
        if key in required or key.lower() in COMMAND_KEYS:
            args[key] = _value_for(key, sub if isinstance(sub, dict) else {}, command)
    return args


def _fill(value: Any, command: str, rnd: int) -> Any:
    if isinstance(value, str):
        return value.replace("{command}", command).replace("{round}", str(rnd))
    if isinstance(value, list):
        return [_fill(v, command, rnd) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, command, rnd) for k, v in value.items()}
    return value


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    # Exactly what the templates render for a served call, so a re-rendered history matches the sample.
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def decide(script: Script, tools: list[dict[str, Any]] | None, tool_results: int) -> Decision:
    if not tools:
        return Decision(script.no_tools_text, tool_results, None)
    if tool_results >= script.tool_rounds:
        return Decision(script.final_text, tool_results, None)
    rnd = tool_results
    step = script.steps[rnd] if rnd < len(script.steps) else ScriptStep()
    command = script.commands[rnd % len(script.commands)] if script.commands else "ls"
    tool = choose_tool(tools, step.tools, script.tool_preference)
    if tool is None:
        return Decision(script.final_text, rnd, None)
    name = tool_name(tool) or ""
    if step.arguments is not None:
        args = _fill(step.arguments, command, rnd)
    elif name in script.argument_templates:
        args = _fill(script.argument_templates[name], command, rnd)
    else:
        args = schema_arguments(tool_schema(tool), command)
    text = (step.text + "\n" if step.text else "") + tool_call_text(name, args)
    return Decision(text, rnd, name)


_TOOLS_BLOCK = re.compile(r"<tools>\n(.*?)\n</tools>", re.S)  # not the "<tools></tools>" in the instructions


def chat_from_prompt_text(prompt: str) -> ChatContext:
    """Tools and tool results recovered from a rendered prompt (token-id prompts on /v1/completions).

    Only the tool count matters to the script, so each result becomes a bare tool message."""
    tools = []
    m = _TOOLS_BLOCK.search(prompt)
    if m:
        for line in m.group(1).splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    tools.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    # The last user turn starts the reply; count results only in the conversation, not the tool list.
    body = prompt[m.end():] if m else prompt
    messages = [{"role": "tool", "content": ""} for _ in range(body.count("<tool_response>"))]
    return ChatContext(messages=messages, tools=tools or None)


def conversation_text(chat: ChatContext) -> str:
    """Every message's text (string contents and text parts), for route markers."""
    out = []
    for m in chat.messages:
        content = m.get("content")
        parts = content if isinstance(content, list) else [content]
        out += [p if isinstance(p, str) else str(p.get("text", "")) for p in parts if isinstance(p, (str, dict))]
    return "\n".join(out)


def count_tool_results(chat: ChatContext) -> int:
    return sum(1 for m in chat.messages if m.get("role") == "tool")


def stand_in_logprob(position: int, token_id: int) -> float:
    # Deterministic, negative, varied: tests can tell positions apart and compare runs exactly.
    return -round(0.001 + ((position * 7919 + token_id * 104729) % 997) / 997 * 2.0, 6)


class ScriptedStream:
    def __init__(self, backend: "ScriptedBackend", request: GenerationRequest, ids: list[int],
                 script: Script | None = None) -> None:
        self.backend = backend
        self.script = script  # the conversation's (routed); None: the backend's as it is when the stream starts
        self.request = request
        self.ids = ids
        k = request.params.prompt_logprobs
        if k is None:
            self.prompt_logprobs = None
        else:
            pl: list[PromptLogprob | None] = [None]
            for pos, tid in enumerate(request.prompt_ids[1:], start=1):
                lp = stand_in_logprob(pos, tid)
                pl.append(PromptLogprob(tid, lp, 1, self._alternatives(tid, lp, k)))
            self.prompt_logprobs = pl

    def _alternatives(self, tid: int, lp: float, k: int) -> list[tuple[int, float]]:
        vocab = self.backend.tokenizer.vocab_size
        return [(tid, lp)] + [((tid + j) % vocab, round(lp - 0.5 * j, 6)) for j in range(1, k)] if k else []

    def __iter__(self) -> Iterator[SampledToken]:
        script = self.script or self.backend.script
        cancelled = self.request.cancelled
        if script.first_token_delay_s:
            time.sleep(script.first_token_delay_s)
        base = len(self.request.prompt_ids)
        for i, tid in enumerate(self.ids[: self.request.params.max_tokens]):
            if cancelled is not None and cancelled.is_set():
                return
            if script.token_delay_s:
                time.sleep(script.token_delay_s)
            lp = stand_in_logprob(base + i, tid)
            yield SampledToken(tid, lp, self._alternatives(tid, lp, self.request.params.top_logprobs))


class ScriptedBackend:
    def __init__(self, tokenizer: Tokenizer, chat_template: str, *, model_name: str = "smollm2",
                 script: Script | None = None, max_model_len: int = 8192,
                 template_vars: dict[str, Any] | None = None, stop_token_ids: frozenset[int] | None = None) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.script = script or Script()
        self.template_vars = dict(template_vars or {})
        self.stop_token_ids = stop_token_ids or tokenizer.eos_token_ids
        self.end_of_turn = min(self.stop_token_ids)

    def _routed(self, request: GenerationRequest) -> tuple[Script, ChatContext]:
        text = None if request.chat else self.tokenizer.decode(request.prompt_ids, skip_special_tokens=False)
        chat = request.chat or chat_from_prompt_text(text or "")
        script = self.script
        if script.routes:
            script = script.routed(text if text is not None else conversation_text(chat))
        return script, chat

    def decision(self, request: GenerationRequest) -> Decision:
        script, chat = self._routed(request)
        return decide(script, chat.tools, count_tool_results(chat))

    def generate(self, request: GenerationRequest) -> ScriptedStream:
        script, chat = self._routed(request)
        text = decide(script, chat.tools, count_tool_results(chat)).text
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.end_of_turn]
        return ScriptedStream(self, request, ids, script if self.script.routes else None)


def scripted_backend_for(model: str = "smollm2", script: Script | None = None, max_model_len: int = 131072,
                         served_name: str | None = None) -> ScriptedBackend:
    """A scripted backend with the real tokenizer and chat template of a shipped model."""
    from tracefleet.formats.models import ensure_tokenizer_json, resolve_model, template_source
    from tracefleet.formats.tokenizer import HFTokenizer

    spec = resolve_model(model, served_name)
    tok = HFTokenizer(ensure_tokenizer_json(spec.gguf_path), add_bos=spec.add_bos)
    stop = frozenset(tok.eos_token_ids | {i for t in spec.end_of_turn_tokens for i in tok.encode(t)})
    return ScriptedBackend(tok, template_source(spec, tok.chat_template), model_name=spec.name, script=script,
                           max_model_len=max_model_len, template_vars=spec.template_vars(tok),
                           stop_token_ids=stop)
