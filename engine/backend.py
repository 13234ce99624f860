"""The contract between the HTTP server and a model backend.

The server owns everything vLLM-shaped (rendering, validation, tool-call parsing, SSE); a backend
only turns prompt token ids into sampled tokens. Generation is a plain synchronous iterator (the
server runs it in a worker thread), so llama.cpp and the scripted backend look the same from above.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

from tracefleet.formats.tokenizer import Tokenizer


@dataclass
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    top_logprobs: int = 0  # alternatives per sampled token (the sampled token's own logprob is always given)
    prompt_logprobs: int | None = None  # None: none; k >= 0: the prompt tokens' logprobs (+ top k)
    ignore_eos: bool = False


@dataclass
class ChatContext:
    """The chat request behind a generation, for backends that answer from a script."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    params: SamplingParams
    chat: ChatContext | None = None  # None for /v1/completions
    cancelled: Any = None  # a threading.Event the server sets when the client went away


@dataclass
class SampledToken:
    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)  # best first


@dataclass
class PromptLogprob:
    token_id: int
    logprob: float
    rank: int
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)


class GenerationStream(Protocol):
    """Iterates sampled tokens; stops by itself at EOS (the EOS token is yielded, as vLLM returns it)."""

    prompt_logprobs: list[PromptLogprob | None] | None

    def __iter__(self) -> Iterator[SampledToken]: ...


class Backend(Protocol):
    model_name: str
    max_model_len: int
    tokenizer: Tokenizer
    chat_template: str
    stop_token_ids: frozenset[int]  # end of an assistant turn (EOS and the template's end-of-turn token)
    template_vars: dict[str, Any]  # extra variables the chat template needs (bos_token, default_system, ...)

    def generate(self, request: GenerationRequest) -> GenerationStream: ...
