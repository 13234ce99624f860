"""The vLLM OpenAI-API subset the engine serves: its routes, request models and error body, shared by the
server (`tracefleet.engine.openai`) and its clients.

Unknown fields are accepted and ignored, as vLLM does; the fields tracefleet relies on are typed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


# Routes, as vLLM serves them
CHAT_COMPLETIONS = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MODELS = "/v1/models"
TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
HEALTH = "/health"
VERSION = "/version"
METRICS = "/metrics"
# Test and bench controls of the tracefleet engine (not vLLM's)
SCRIPTED_SCRIPT = "/scripted/script"
FORCED_REPLIES = "/forced/replies"

ENGINE_VERSION = "tracefleet-engine-0.1.0"  # GET /version (the proxy's version check knows it is not a vLLM)


class _Base(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Base):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class ChatCompletionRequest(_Base):
    model: str | None = None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=0, ge=0, le=20)
    n: int = 1
    return_token_ids: bool = False
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False


class CompletionRequest(_Base):
    model: str | None = None
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=0)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    n: int = 1
    return_token_ids: bool = False
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)
    add_special_tokens: bool = True
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False


class TokenizeRequest(_Base):
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None  # default: True for prompt, False for messages (vLLM)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Base):
    model: str | None = None
    tokens: list[int]


ErrorType = Literal["BadRequestError", "NotFoundError", "InternalServerError"]


class ForcedReplies(_Base):
    """`PUT /forced/replies` (CPU engine, tests and benches): the texts the next generations emit."""

    replies: list[str]


class EngineError(Exception):
    """An error the client caused or should see, rendered as vLLM's error body."""

    def __init__(self, message: str, status_code: int = 400, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        # vLLM >= 0.10 (OpenAI's shape): {"error": {"message", "type", "param", "code"}}.
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param,
                          "code": self.status_code}}
