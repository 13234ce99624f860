"""Family output parsers: a table of sampled texts (well-formed, malformed, partial) per family, and the
same result whether the text arrives whole, one character at a time, or in random chunks."""

from __future__ import annotations

import json
import random

import pytest

from tracefleet.formats.families import detect_family
from tracefleet.formats.models import TEMPLATES
from tracefleet.formats.parsers import make_parser, parse_output

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {
    "command": {"type": "string"}, "timeout": {"type": "integer"}}}}},
         {"type": "function", "function": {"name": "edit", "parameters": {"type": "object", "properties": {
             "path": {"type": "string"}, "lines": {"type": "array"}, "code": {"type": "string"}}}}}]

HC = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
XC = "<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n<parameter=timeout>\n5\n</parameter>\n</function>\n</tool_call>"

# (family, sampled text, prompt tail, content, reasoning, [(name, args)], number of flagged errors)
CASES = [
    # ChatML / SmolLM2 (hermes)
    ("chatml", "Hello there!", "", "Hello there!", "", [], 0),
    ("chatml", HC, "", "", "", [("bash", {"command": "ls"})], 0),
    ("chatml", "Let me look.\n" + HC, "", "Let me look.\n", "", [("bash", {"command": "ls"})], 0),
    ("chatml", HC + "\n" + HC.replace("ls", "pwd"), "", "", "", [("bash", {"command": "ls"}), ("bash", {"command": "pwd"})], 0),
    ("chatml", '<tool_call>{"name":"bash","arguments":{"command":"ls"}}</tool_call>', "", "", "", [("bash", {"command": "ls"})], 0),
    ("chatml", '<tool_call>\n{"name": "bash", "parameters": {"command": "ls"}}\n</tool_call>', "", "", "", [("bash", {"command": "ls"})], 0),
    ("chatml", '<tool_call>\n{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}\n</tool_call>', "", "", "", [("bash", {"command": "ls"})], 0),
    ("chatml", '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n', "", "", "", [("bash", {"command": "ls"})], 0),  # EOS before </tool_call>
    ("chatml", '<tool_call>\n{"name": "bash", "arguments": {"comm', "", '<tool_call>\n{"name": "bash", "arguments": {"comm', "", [], 1),  # cut off
    ("chatml", "x <tool_call>{\"name\": bad}</tool_call> y", "", "x <tool_call>{\"name\": bad}</tool_call> y", "", [], 1),
    ("chatml", '<tool_call>["bash"]</tool_call>', "", '<tool_call>["bash"]</tool_call>', "", [], 1),
    ("chatml", '<tool_call>{"arguments": {}}</tool_call>', "", '<tool_call>{"arguments": {}}</tool_call>', "", [], 1),
    ("chatml", '<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', "", '<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', "", [], 1),
    ("chatml", "a < b and <tool", "", "a < b and <tool", "", [], 0),
    ("chatml", "<think>not a reasoning family</think>ok", "", "<think>not a reasoning family</think>ok", "", [], 0),
    ("chatml", HC + "\n\n", "", "", "", [("bash", {"command": "ls"})], 0),
    # Gemma 3 (the shipped template: hermes blocks)
    ("gemma3", "Sure.", "", "Sure.", "", [], 0),
    ("gemma3", HC, "", "", "", [("bash", {"command": "ls"})], 0),
    ("gemma3", '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}', "", '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}', "", [], 1),
    ("gemma3", "Result: ünïcödé ✓", "", "Result: ünïcödé ✓", "", [], 0),
    # Qwen3 / Qwen3.5: <think> + hermes or XML calls
    ("qwen3", "<think>\nI should list.\n</think>\n\n" + HC, "", "", "\nI should list.\n", [("bash", {"command": "ls"})], 0),
    ("qwen3", "<think>\nhmm\n</think>\n\nThe answer is 4.", "", "The answer is 4.", "\nhmm\n", [], 0),
    ("qwen3", "hmm, think first\n</think>\n\nDone.", "<|im_start|>assistant\n<think>\n", "Done.", "hmm, think first\n", [], 0),
    ("qwen3", "Plain answer without thinking.", "<|im_start|>assistant\n<think>\n\n</think>\n\n", "Plain answer without thinking.", "", [], 0),
    ("qwen3", "<think>\nstill thinking when cut", "", "", "\nstill thinking when cut", [], 0),
    ("qwen3", XC, "", "", "", [("bash", {"command": "ls -la", "timeout": 5})], 0),
    ("qwen3", "<think>x</think>" + XC + "\n" + HC, "", "", "x", [("bash", {"command": "ls -la", "timeout": 5}), ("bash", {"command": "ls"})], 0),
    ("qwen3_coder", "<tool_call>\n<function=edit>\n<parameter=path>\na.py\n</parameter>\n<parameter=lines>\n[1, 2]\n</parameter>\n"
                    "<parameter=code>\ndef f():\n    return {\"a\": 1}\n</parameter>\n</function>\n</tool_call>", "", "", "",
     [("edit", {"path": "a.py", "lines": [1, 2], "code": 'def f():\n    return {"a": 1}'})], 0),
    ("qwen3_coder", "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</function>\n</tool_call>", "",
     "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</function>\n</tool_call>", "", [], 1),  # unclosed parameter
    ("qwen3_coder", "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n", "",
     "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n", "", [], 1),  # cut off before </function>
    ("qwen3_coder", "<tool_call>\n<function=bash>\n</function>\n</tool_call>", "", "", "", [("bash", {})], 0),
    # Llama 3.x JSON tool calls
    ("llama3", "The weather is sunny.", "", "The weather is sunny.", "", [], 0),
    ("llama3", '{"name": "bash", "parameters": {"command": "ls"}}', "", "", "", [("bash", {"command": "ls"})], 0),
    ("llama3", '<|python_tag|>{"name": "bash", "parameters": {"command": "ls"}}', "", "", "", [("bash", {"command": "ls"})], 0),
    ("llama3", '{"name": "bash", "parameters": {"command": "ls"}}; {"name": "edit", "parameters": {"path": "x"}}', "", "", "",
     [("bash", {"command": "ls"}), ("edit", {"path": "x"})], 0),
    ("llama3", '{"name": "bash", "parameters": {"command": "ls"', "", '{"name": "bash", "parameters": {"command": "ls"', "", [], 1),
    ("llama3", '{"city": "Paris"} is JSON', "", '{"city": "Paris"} is JSON', "", [], 0),
    ("llama3", "  \n" + '{"name": "bash", "arguments": {"command": "ls"}}', "", "", "", [("bash", {"command": "ls"})], 0),
]


def _check(result, content, reasoning, calls, n_errors):
    assert result.content == content
    assert result.reasoning == reasoning
    assert [(c.name, json.loads(c.arguments)) for c in result.calls] == calls
    assert len(result.errors) == n_errors, result.errors


@pytest.mark.parametrize("family,text,prompt,content,reasoning,calls,n_errors", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_parser_table(family, text, prompt, content, reasoning, calls, n_errors):
    _check(parse_output(family, text, TOOLS, prompt_text=prompt), content, reasoning, calls, n_errors)
    # streamed: per character and in random chunks, the same events in the same order
    for chunking in ("chars", "random"):
        parser = make_parser(family, TOOLS, prompt_text=prompt)
        rnd = random.Random(len(text))
        events, i = [], 0
        while i < len(text):
            n = 1 if chunking == "chars" else rnd.randint(1, 9)
            events += parser.feed(text[i:i + n])
            i += n
        events += parser.finish()
        streamed = type("R", (), {})()
        streamed.content = "".join(e.text for e in events if e.kind == "text")
        streamed.reasoning = "".join(e.text for e in events if e.kind == "reasoning")
        streamed.calls = [e.call for e in events if e.kind == "tool_call"]
        streamed.errors = parser.errors
        _check(streamed, content, reasoning, calls, n_errors)


def test_content_streams_before_the_reply_ends():
    parser = make_parser("qwen3", TOOLS)
    assert [e.kind for e in parser.feed("<think>\nplan")] == ["reasoning"]
    assert [(e.kind, e.text) for e in parser.feed(" more</think>\n\nHel")] == [("reasoning", " more"), ("text", "Hel")]
    # "<tool_" may still become a tag: held back, the rest is released at once
    assert [(e.kind, e.text) for e in parser.feed("lo <tool_")] == [("text", "lo ")]
    assert parser.feed('call>{"name": "bash", "arguments": ') == []  # a call is emitted only when complete
    evs = parser.feed('{}}</tool_call>')
    assert [e.kind for e in evs] == ["tool_call"] and evs[0].call.name == "bash"


def test_unparseable_call_is_text_and_flagged_never_dropped():
    r = parse_output("chatml", 'ok <tool_call>{"name": "bash", "arguments": {"command": "ls"</tool_call>', TOOLS)
    assert r.calls == [] and "<tool_call>" in r.content and "bash" in r.content and r.errors


@pytest.mark.parametrize("template,expected", [
    ("chatml_tools.jinja", "chatml"), ("gemma3_tools.jinja", "gemma3"), ("qwen3_tools.jinja", "qwen3"),
])
def test_family_from_shipped_templates(template, expected):
    assert detect_family(template=(TEMPLATES / template).read_text()) == expected


def test_family_detection_order():
    assert detect_family(template="{{'<|start_header_id|>'}}<|eot_id|>") == "llama3"
    assert detect_family(template="<|im_start|><tool_call><function=x><parameter=y>") == "qwen3_coder"
    assert detect_family(model_type="qwen3") == "qwen3"
    assert detect_family(architecture="gemma3") == "gemma3"
    assert detect_family(template="<|im_start|>", model_type="qwen3", override="llama3") == "llama3"
    with pytest.raises(ValueError):
        detect_family(override="nope")


def test_documented_differences_from_vllm_parsers():
    """The rules the parsers' docstring says differ from vLLM's on purpose (vLLM's result in the comments)."""
    bad = '<tool_call>\n{"name": "bash", "arguments": {"command": \n</tool_call>'
    r = parse_output("chatml", bad + "\n" + HC, tools=TOOLS)
    # vLLM hermes: all or nothing -> no calls, the whole text as content
    assert [c.name for c in r.calls] == ["bash"] and len(r.errors) == 1 and r.content.startswith("<tool_call>")
    r = parse_output("chatml", "Before.\n" + HC + "\nAfter.", tools=TOOLS)
    # vLLM hermes: content is the text before the first <tool_call> only ("Before.\n")
    assert r.content == "Before.\n\nAfter." and len(r.calls) == 1
    r = parse_output("chatml", '<tool_call>{"name": "bash", "parameters": {"command": "ls"}}</tool_call>', tools=TOOLS)
    # vLLM hermes: needs "arguments" -> no call
    assert [json.loads(c.arguments) for c in r.calls] == [{"command": "ls"}]
    r = parse_output("qwen3", "no think tags here")
    # vLLM v0.33 qwen3: starts in reasoning -> all reasoning
    assert (r.content, r.reasoning) == ("no think tags here", "")
    r = parse_output("llama3", 'Sure: {"name": "bash", "parameters": {"command": "ls"}}', tools=TOOLS)
    # vLLM v0.33 llama3_json: raw_decode at every "{" -> one call, the prose dropped
    assert r.calls == [] and r.content.startswith("Sure:")
