"""Rendering and parsing pieces of the engine, checked against the model's own artifacts."""

from __future__ import annotations

import json

import pytest

from tracefleet.formats.chat_template import TemplateError, render_chat
from tracefleet.formats.models import ensure_tokenizer_json, resolve_model
from tracefleet.engine.scripted import Script, ScriptStep, chat_from_prompt_text, decide
from tracefleet.formats.tokenizer import HFTokenizer
from tracefleet.formats.tool_parser import StreamingToolParser, parse_tool_calls

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "and now? ünïcödé"}],
    [{"role": "user", "content": "a\n\nb"}, {"role": "assistant", "content": "  spaced  "}],
]


@pytest.fixture(scope="module")
def smollm2():
    spec = resolve_model("smollm2")
    tok = HFTokenizer(ensure_tokenizer_json(spec.gguf_path), add_bos=spec.add_bos)
    return spec, tok


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("gen", [True, False])
def test_shipped_chatml_equals_smollm2_embedded_template_without_tools(smollm2, messages, gen):
    spec, tok = smollm2
    assert tok.chat_template  # read from the GGUF's tokenizer.chat_template
    ours = render_chat(spec.template_file.read_text(), messages, add_generation_prompt=gen,
                       **spec.template_vars(tok))
    assert ours == render_chat(tok.chat_template, messages, add_generation_prompt=gen)


def test_embedded_template_cannot_render_tool_calls_ours_can(smollm2):
    spec, tok = smollm2
    msgs = [{"role": "user", "content": "x"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "1", "content": "a.txt"}]
    with pytest.raises(TemplateError):
        render_chat(tok.chat_template, msgs)
    text = render_chat(spec.template_file.read_text(), msgs, **spec.template_vars(tok))
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call><|im_end|>\n' in text
    assert "<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n" in text


def test_gemma_template_turns():
    spec = resolve_model("gemma3-270m")
    text = render_chat(spec.template_file.read_text(),
                       [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                        {"role": "assistant", "content": "A"}], bos_token="<bos>")
    assert text == "<bos><start_of_turn>user\nS\n\nQ<end_of_turn>\n<start_of_turn>model\nA<end_of_turn>\n" \
                   "<start_of_turn>model\n"


def test_tool_parser_streaming_equals_whole():
    text = 'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n' \
           '<tool_call>\n{"name": "read", "arguments": {"path": "a"}}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me look.\n" and [c.name for c in calls] == ["bash", "read"]
    assert json.loads(calls[0].arguments) == {"command": "ls"}
    parser = StreamingToolParser()
    pieces = [parser.feed(ch) for ch in text]
    tail, more = parser.finish()
    assert "".join(p[0] for p in pieces) + tail == content
    assert [c.name for p in pieces for c in p[1]] + [c.name for c in more] == ["bash", "read"]
    assert parse_tool_calls("plain <tool_call>not json</tool_call>")[1] == []
    assert parse_tool_calls("a < b <tool")[0] == "a < b <tool"


HARNESS_TOOLS = {
    "claude": {"name": "Bash", "input_schema": {"type": "object", "required": ["command"], "properties": {
        "command": {"type": "string"}, "timeout": {"type": "number"}, "description": {"type": "string"}}}},
    "codex": {"type": "function", "function": {"name": "shell", "parameters": {
        "type": "object", "required": ["command"], "properties": {
            "command": {"type": "array", "items": {"type": "string"}}, "workdir": {"type": "string"}}}}},
    "gemini": {"type": "function", "function": {"name": "run_shell_command", "parameters": {
        "type": "object", "required": ["command"], "properties": {
            "command": {"type": "string"}, "directory": {"type": "string"}}}}},
}


@pytest.mark.parametrize("harness,expected", [
    ("claude", {"command": "echo tracefleet > note.txt"}),
    ("codex", {"command": ["bash", "-lc", "echo tracefleet > note.txt"]}),
    ("gemini", {"command": "echo tracefleet > note.txt"}),
])
def test_script_picks_the_shell_and_fills_its_schema(harness, expected):
    other = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}
    d = decide(Script(), [other, HARNESS_TOOLS[harness]], tool_results=0)
    body = json.loads(d.text[len("<tool_call>\n"):-len("\n</tool_call>")])
    assert body["arguments"] == expected and d.round == 0


def test_script_step_that_names_an_absent_tool_answers_in_text():
    script = Script(steps=[ScriptStep(tools=["nope"])])
    assert decide(script, [HARNESS_TOOLS["gemini"]], 0).tool is None


def test_prompt_text_recovers_tools_and_results(smollm2):
    spec, tok = smollm2
    tools = [HARNESS_TOOLS["gemini"]]
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "1", "type": "function", "function": {
                "name": "run_shell_command", "arguments": {"command": "ls"}}}]},
            {"role": "tool", "tool_call_id": "1", "content": "x"}]
    text = render_chat(spec.template_file.read_text(), msgs, tools=tools, **spec.template_vars(tok))
    chat = chat_from_prompt_text(text)
    assert chat.tools == tools and len(chat.messages) == 1
