"""The canonical conversation every dialect maps into and out of.

One model for all four wire formats, so the token engine, the capture log and the exact-mode
renderer (issue 4) see a single shape. Parts keep what round-tripping needs (tool-call ids, the
arguments string as the harness sent it, opaque reasoning signatures) and nothing dialect-specific.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant", "tool"]
PartType = Literal["text", "image", "reasoning", "tool_call", "tool_result"]


class Part(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: PartType
    text: str | None = None  # text, reasoning text, tool-result text
    # image: a URL or a data: URL (base64); media_type when known
    image_url: str | None = None
    media_type: str | None = None
    # reasoning: opaque provider blob sent back by the harness (Anthropic signature, OpenAI
    # encrypted_content, Google thoughtSignature); kept verbatim, never fabricated
    signature: str | None = None
    redacted: bool = False
    # tool_call / tool_result
    id: str | None = None  # tool call id (tool_call) or the id of the call answered (tool_result)
    name: str | None = None
    arguments: str | None = None  # JSON text exactly as the harness or the engine produced it
    kind: Literal["function", "custom"] = "function"
    is_error: bool = False


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Role
    parts: list[Part] = Field(default_factory=list)

    def text(self) -> str:
        return "".join(p.text or "" for p in self.parts if p.type == "text")


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    kind: Literal["function", "custom"] = "function"  # custom = free-form text input (Responses API)


class Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    reasoning_effort: str | None = None  # "low" | "medium" | "high" | a budget as text


class Conversation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None  # what the harness asked for
    messages: list[Message]
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] | None = None  # "auto" | "none" | "required" | {"name": ...}
    parallel_tool_calls: bool | None = None
    sampling: Sampling = Field(default_factory=Sampling)
    stream: bool = False
    # dialect echo flags that change only the wire rendering (include_usage, include, store, ...)
    options: dict[str, Any] = Field(default_factory=dict)


def text_part(text: str) -> Part:
    return Part(type="text", text=text)


class ToolCall(BaseModel):
    """A tool call the engine produced, after its arguments have been fully received."""

    id: str
    name: str
    arguments: str
    kind: Literal["function", "custom"] = "function"
