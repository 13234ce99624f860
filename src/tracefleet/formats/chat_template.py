"""Chat-template rendering the way vLLM does it (Hugging Face's jinja environment and `tojson`).

The proxy's exact mode renders conversations itself and splices served token ids; it only stays
exact if its rendering and this one agree byte for byte, so both follow transformers' conventions:
sandboxed jinja with trim_blocks/lstrip_blocks, `tojson` that keeps key order and non-ASCII text,
tool-call arguments given to the template as objects, not JSON strings.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(ValueError):
    """The conversation cannot be rendered (the message is shown to the client as a 400)."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compiled(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def content_text(content: Any) -> str | None:
    """OpenAI content (string, or list of parts) as the plain text the templates expect."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        return "".join(texts) if texts else ""
    raise TemplateError(f"message content must be a string or a list of parts, not {type(content).__name__}")


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or "role" not in msg:
            raise TemplateError(f"messages[{i}] must be an object with a 'role'")
        m = dict(msg)
        m["content"] = content_text(m.get("content"))
        calls = []
        for call in m.get("tool_calls") or []:
            call = dict(call)
            fn = dict(call.get("function") or {})
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    fn["arguments"] = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError:
                    pass  # keep the raw string: the template writes it as a JSON string
            call["function"] = fn
            calls.append(call)
        m["tool_calls"] = calls or None
        out.append(m)
    return out


def render_chat(template: str, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                add_generation_prompt: bool = True, bos_token: str = "", eos_token: str = "",
                **kwargs: Any) -> str:
    try:
        return compiled(template).render(
            messages=normalize_messages(messages), tools=tools or None, add_generation_prompt=add_generation_prompt,
            bos_token=bos_token, eos_token=eos_token, **kwargs)
    except TemplateError:
        raise
    except Exception as exc:  # jinja errors, None + str, ... : the request does not fit the template
        raise TemplateError(f"cannot apply the chat template: {exc}") from exc
