"""Canonical conversation → the messages and tools the model's chat template expects → text → token ids.

The message shapes are the ones the engine's own chat route receives in server mode
(`token_engine.engine_messages`), so a first turn rendered here is token-for-token what the engine
would have rendered. Reasoning options map onto the template variables the families use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tracefleet.formats.families import ModelFormat

from tracefleet.proxy.canonical import Conversation
from tracefleet.proxy.token_engine import engine_messages, engine_tools, reasoning_template_kwargs


@dataclass
class Rendered:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    kwargs: dict[str, Any]
    text: str

    @property
    def tail(self) -> str:
        return self.text[-64:]


def template_kwargs(fmt: ModelFormat, conv: Conversation) -> dict[str, Any]:
    # the variables server mode sends as chat_template_kwargs (Qwen3 templates read enable_thinking; others
    # ignore unknown variables), so both modes render the same prompt
    return reasoning_template_kwargs(conv.sampling.reasoning_effort)


def template_inputs(conv: Conversation) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    # tools are rendered even under tool_choice "none": vLLM does so unless started with
    # --exclude-tools-when-tool-choice-none (off by default), and server mode must see the same prompt
    tools = engine_tools(conv) if conv.tools else None
    return engine_messages(conv), tools


def render_conversation(fmt: ModelFormat, conv: Conversation, *, add_generation_prompt: bool = True) -> Rendered:
    messages, tools = template_inputs(conv)
    kwargs = template_kwargs(fmt, conv)
    text = fmt.render(messages, tools, add_generation_prompt=add_generation_prompt, **kwargs)
    return Rendered(messages, tools, kwargs, text)


def render_ids(fmt: ModelFormat, conv: Conversation) -> list[int]:
    return fmt.encode(render_conversation(fmt, conv).text)
