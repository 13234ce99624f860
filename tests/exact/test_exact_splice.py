"""Splicing with the real SmolLM2 / Gemma tokenizers and the shipped templates.

Requests go through the real dialect parsers (as a harness would send them, mutations included); the
"sampled" completion of each turn is token ids the model could have produced (compact JSON, unlike the
template's own layout), so a re-render would differ from what was served and only splicing stays exact.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tracefleet.formats.families import load_model_format
from tracefleet.formats.models import TEMPLATES
from tracefleet.formats.parsers import parse_output
from tracefleet.proxy.dialects.anthropic import Anthropic
from tracefleet.proxy.dialects.openai_chat import OpenAIChat
from tracefleet.proxy.exact.render import render_conversation
from tracefleet.proxy.exact.splice import SessionSplicer, SplicedPrompt

ANTHROPIC, CHAT = Anthropic(), OpenAIChat()
BASH = {"name": "bash", "description": "Run a shell command", "input_schema": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
SYSTEM = "You are a coding agent. Use the bash tool."


@pytest.fixture(scope="module")
def smollm2():
    return load_model_format("smollm2")


@pytest.fixture(scope="module")
def smollm2_qwen3():
    return load_model_format("smollm2", template_file=TEMPLATES / "qwen3_tools.jinja")


@pytest.fixture(scope="module")
def gemma():
    return load_model_format("gemma3-270m")


class Session:
    """Drives a splicer the way the proxy does: splice → (sampled ids) → parse → record."""

    def __init__(self, fmt) -> None:
        self.fmt = fmt
        self.sp = SessionSplicer(fmt, verify_full=True)
        self.spliced: list[SplicedPrompt] = []
        self.served: list[list[int]] = []  # prompt + completion per call
        self.n = 0

    def call(self, conv, sampled_text: str, *, eot: bool = True):
        spliced = self.sp.prompt(conv)
        comp = self.fmt.encode(sampled_text) + ([self.fmt.end_of_turn_id] if eot else [])
        r = parse_output(self.fmt.family.name, sampled_text, spliced.rendered.tools, prompt_text=spliced.rendered.tail)
        self.n += 1
        cid = f"call{self.n}"
        self.sp.record(cid, spliced, comp, r.content, [(c.name, c.arguments) for c in r.calls])
        self.spliced.append(spliced)
        self.served.append(spliced.prompt_ids + comp)
        return spliced, r


def _tool_text(command: str, thought: str = "") -> str:
    think = f"<think>\n{thought}\n</think>\n\n" if thought else ""
    return think + '<tool_call>\n{"name":"bash","arguments":{"command":"' + command + '"}}\n</tool_call>'


def _assert_chain(s: Session, start: int = 1) -> None:
    for k in range(start, len(s.spliced)):
        spliced, prev = s.spliced[k], s.served[k - 1]
        assert spliced.info.parent_call_id == f"call{k}", (k, spliced.info)
        assert spliced.info.new_root_reason is None
        assert spliced.prompt_ids[:len(prev)] == prev  # byte-for-byte in token space
        assert spliced.info.reused_tokens == len(prev)
        assert spliced.info.rendered_tokens == len(spliced.prompt_ids) - len(prev)
        # the rendered suffix is exactly the tail of a full render's ids
        full = s.fmt.encode(spliced.rendered.text)
        assert full[-spliced.info.rendered_tokens:] == spliced.prompt_ids[len(prev):]


def _anthropic_history(turns: list[tuple[str, str]], mutate: int) -> list[dict[str, Any]]:
    """Claude-Code-shaped history: each (command, output) is a tool_use + tool_result; mutations vary by turn."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Fix the bug."},
                                                               {"type": "text", "text": " Then run the tests."}]}]
    if mutate % 2:  # text blocks collapsed into one string
        msgs[0] = {"role": "user", "content": "Fix the bug. Then run the tests."}
    for i, (cmd, out) in enumerate(turns):
        blocks: list[dict[str, Any]] = []
        if mutate % 3 == 0:  # reasoning echoed back (signature kept verbatim)
            blocks.append({"type": "thinking", "thinking": "I will run it.", "signature": "sig"})
        blocks.append({"type": "tool_use", "id": f"toolu_{i}", "name": "bash", "input": {"command": cmd}})
        msgs.append({"role": "assistant", "content": blocks})
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": out}
        if i == (mutate % max(1, len(turns))):  # cache marker moves every turn
            result["cache_control"] = {"type": "ephemeral"}
        msgs.append({"role": "user", "content": [result]})
    return msgs


def _anthropic(msgs: list[dict[str, Any]], *, system: str | None = SYSTEM, in_messages: bool = False):
    body: dict[str, Any] = {"model": "m", "max_tokens": 64, "tools": [BASH], "messages": msgs}
    if system and in_messages:  # role:"system" inside messages instead of the top-level field
        body["messages"] = [{"role": "system", "content": system}] + msgs
    elif system:
        body["system"] = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
    return ANTHROPIC.parse(body)


@pytest.mark.parametrize("fmt_name", ["smollm2", "smollm2_qwen3", "gemma"])
def test_mutated_anthropic_history_stays_one_exact_chain(fmt_name, request):
    fmt = request.getfixturevalue(fmt_name)
    s = Session(fmt)
    turns: list[tuple[str, str]] = []
    commands = ["ls", "cat a.py", "pytest -q", "sed -i s/x/y/ a.py", "pytest -q", "git diff"]
    for k, cmd in enumerate(commands):
        conv = _anthropic(_anthropic_history(turns, mutate=k), in_messages=k % 2 == 1)
        thought = f"step {k}" if fmt_name == "smollm2_qwen3" else ""
        spliced, parsed = s.call(conv, _tool_text(cmd, thought))
        assert [c.name for c in parsed.calls] == ["bash"] and json.loads(parsed.calls[0].arguments) == {"command": cmd}
        turns.append((cmd, f"output of {cmd}\n" * (k + 1)))
    final = _anthropic(_anthropic_history(turns, mutate=7))
    s.call(final, "All tests pass.")
    assert s.spliced[0].info.new_root_reason == "new_conversation"
    _assert_chain(s)
    # a full re-render would have conditioned the model on other tokens than it sampled
    assert any(p.checked_full_ids != p.prompt_ids for p in s.spliced[1:])


def test_qwen3_template_rewrites_history_but_the_chain_holds(smollm2_qwen3):
    """New user queries make the Qwen3 template drop earlier reasoning; the spliced prompt keeps it."""
    fmt = smollm2_qwen3
    s = Session(fmt)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2+2?"}]
    for k in range(4):
        _, parsed = s.call(CHAT.parse({"model": "m", "messages": msgs}), f"<think>\nadd {k}\n</think>\n\nIt is {4 + k}.")
        assert parsed.reasoning == f"\nadd {k}\n" and parsed.content == f"It is {4 + k}."
        msgs += [{"role": "assistant", "content": parsed.content, "reasoning_content": parsed.reasoning},
                 {"role": "user", "content": f"And plus {k + 1}?"}]
    _assert_chain(s)
    last = s.spliced[-1]
    assert "<think>\nadd 0\n</think>" not in last.rendered.text  # the template dropped it ...
    assert "<think>\nadd 0\n</think>" in fmt.tokenizer.decode(last.prompt_ids, skip_special_tokens=False)  # ... we did not


def test_chat_reserialised_arguments_and_parallel_results(smollm2):
    s = Session(smollm2)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": BASH["input_schema"]}}]
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    two = _tool_text("ls") + "\n" + _tool_text("pwd")
    _, parsed = s.call(CHAT.parse({"model": "m", "messages": msgs, "tools": tools}), two)
    assert len(parsed.calls) == 2
    msgs.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(json.loads(c.arguments), indent=2)}}
        for i, c in enumerate(parsed.calls)]})
    msgs += [{"role": "tool", "tool_call_id": "c0", "content": "a.txt"}, {"role": "tool", "tool_call_id": "c1", "content": "/w"}]
    s.call(CHAT.parse({"model": "m", "messages": msgs, "tools": tools}), "Done.")
    _assert_chain(s)
    assert s.spliced[1].info.matched_messages == 2


def test_new_roots_and_their_reasons(smollm2):
    s = Session(smollm2)
    turns: list[tuple[str, str]] = []
    for cmd in ["ls", "cat a"]:
        s.call(_anthropic(_anthropic_history(turns, mutate=1)), _tool_text(cmd))
        turns.append((cmd, "out"))
    s.call(_anthropic(_anthropic_history(turns, mutate=1)), "Summary: listed and read a.")
    # compaction: the history is replaced by a summary under the same system prompt
    compacted = _anthropic([{"role": "user", "content": "Fix the bug. Then run the tests."},
                            {"role": "assistant", "content": "Summary of the work so far."},
                            {"role": "user", "content": "Continue."}])
    assert s.sp.prompt(compacted).info.new_root_reason == "compaction"
    # sub-agent: a different system prompt
    sub = _anthropic([{"role": "user", "content": "Search the code for TODOs."}], system="You are a search sub-agent.")
    spliced = s.sp.prompt(sub)
    assert spliced.info.new_root_reason == "sub_agent" and spliced.info.parent_call_id is None
    assert spliced.prompt_ids == smollm2.encode(render_conversation(smollm2, sub).text)
    # an earlier tool result edited: the longest served prefix still holds (a branch off call1)
    tail = [{"role": "assistant", "content": "Summary: listed and read a."}, {"role": "user", "content": "more"}]
    edited = _anthropic(_anthropic_history([("ls", "EDITED"), ("cat a", "out")], mutate=1) + tail)
    branch = s.sp.prompt(edited)
    assert branch.info.parent_call_id == "call1" and branch.prompt_ids[:len(s.served[0])] == s.served[0]
    # rewritten history: the first user turn edited, nothing served matches
    rewritten = _anthropic_history(turns, mutate=1) + tail
    rewritten[0] = {"role": "user", "content": "Fix the OTHER bug."}
    assert s.sp.prompt(_anthropic(rewritten)).info.new_root_reason == "rewritten_history"
    # another tool list: another prompt
    other = _anthropic(_anthropic_history(turns[:1], mutate=1))
    other.tools = []
    assert s.sp.prompt(other).info.new_root_reason == "tools_changed"


def test_auxiliary_calls_beside_the_conversation_are_labelled_so(smollm2):
    """OpenCode's shape: a title call (own system prompt, no tools) comes first; the agent's conversation
    (tools) after it is a new conversation, not a sub-agent; a summary request without tools is auxiliary."""
    s = Session(smollm2)
    title = _anthropic([{"role": "user", "content": "Fix the bug."}], system="You are a title generator.")
    title.tools = []
    assert s.call(title, "Fix the bug")[0].info.new_root_reason == "new_conversation"  # nothing to tell yet
    main = _anthropic(_anthropic_history([], mutate=1))
    assert s.call(main, _tool_text("ls"))[0].info.new_root_reason == "new_conversation"
    summary = _anthropic([{"role": "user", "content": "Summarize the session."}], system="You summarize.")
    summary.tools = []
    assert s.sp.prompt(summary).info.new_root_reason == "auxiliary"
    sub = _anthropic([{"role": "user", "content": "Search the code for TODOs."}], system="You are a search sub-agent.")
    assert s.sp.prompt(sub).info.new_root_reason == "sub_agent"


def test_retry_is_a_sibling_with_the_same_prompt(smollm2):
    s = Session(smollm2)
    conv = _anthropic(_anthropic_history([], mutate=1))
    s.call(conv, _tool_text("ls"))
    s.call(_anthropic(_anthropic_history([("ls", "x")], mutate=1)), _tool_text("cat x"))
    retry = s.sp.prompt(_anthropic(_anthropic_history([("ls", "x")], mutate=2)))  # same meaning, other bytes
    assert retry.retry_of == "call2" and retry.info.parent_call_id == "call1"
    assert retry.prompt_ids == s.spliced[1].prompt_ids


def test_length_stopped_turn_is_closed_with_the_end_of_turn_token(smollm2):
    s = Session(smollm2)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Tell me a story."}]
    _, parsed = s.call(CHAT.parse({"model": "m", "messages": msgs}), "Once upon a time there", eot=False)
    msgs += [{"role": "assistant", "content": parsed.content}, {"role": "user", "content": "Go on."}]
    spliced = s.sp.prompt(CHAT.parse({"model": "m", "messages": msgs}))
    prev = s.served[0]
    assert spliced.info.parent_call_id == "call1" and spliced.prompt_ids[:len(prev)] == prev
    assert spliced.prompt_ids[len(prev)] == smollm2.end_of_turn_id


def test_first_turn_equals_the_engines_own_render(smollm2):
    from tracefleet.formats.chat_template import render_chat
    from tracefleet.formats.models import resolve_model

    conv = _anthropic(_anthropic_history([("ls", "a")], mutate=0))
    spliced = SessionSplicer(smollm2).prompt(conv)
    spec = resolve_model("smollm2")
    text = render_chat(spec.template_file.read_text(), spliced.rendered.messages, tools=spliced.rendered.tools,
                       **spec.template_vars(smollm2.tokenizer))
    assert spliced.prompt_ids == smollm2.tokenizer.encode(text, add_special_tokens=False)
