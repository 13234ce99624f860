"""Provider wire formats. Each module maps its requests to the canonical conversation and renders
engine results back as that provider's JSON, SSE event sequence and error shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import orjson

from tracefleet.proxy.canonical import Conversation, ToolCall
from tracefleet.proxy.errors import ProxyError
from tracefleet.proxy.token_engine import CallState


class StreamWriter(Protocol):
    """Renders one streamed answer. `end()` returns the closing events; the capture record is
    fsync'd before they are sent."""

    def start(self) -> bytes: ...
    def text(self, delta: str) -> bytes: ...
    def reasoning(self, delta: str) -> bytes: ...
    def tool_call(self, call: ToolCall) -> bytes: ...
    def end(self) -> bytes: ...
    def error(self, err: ProxyError) -> bytes: ...
    def ping(self) -> bytes: ...


class DialectCodec(Protocol):
    """One provider's wire format: its requests parsed, its answers, streams and errors rendered."""

    name: str  # the capture log's dialect label (`tracefleet.contract.capture.Dialect`)

    def parse(self, body: Any, path_model: str | None = None) -> Conversation: ...
    def response(self, conv: Conversation, state: CallState) -> dict[str, Any]: ...
    def writer(self, conv: Conversation, state: CallState) -> StreamWriter: ...
    def error_body(self, err: ProxyError) -> dict[str, Any]: ...


def sse(event: str | None, data: Any) -> bytes:
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


SSE_COMMENT_PING = b": ping\n\n"


def expect(cond: bool, message: str, param: str | None = None) -> None:
    if not cond:
        raise ProxyError("invalid_request", message, param=param)


_TYPE_NAMES: dict[type, str] = {
    dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number", type(None): "null"
}


def type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def object_entries(value: Any, field: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The entries of an optional array-of-objects field (tools, ...) with their paths; None is empty.
    A wrong type is a 400 naming the field, in the caller's dialect."""
    if value is None:
        return
    expect(isinstance(value, list), f"invalid type for '{field}': expected array, got {type_name(value)}", field)
    for i, entry in enumerate(value):
        path = f"{field}[{i}]"
        expect(isinstance(entry, dict), f"invalid type for '{path}': expected object, got {type_name(entry)}", path)
        yield path, entry


def want(body: dict[str, Any], key: str, kinds: tuple[type, ...], where: str = "", required: bool = False) -> Any:
    """body[key] if it has one of `kinds` (or is absent and not required), else a 400 naming the field."""
    value = body.get(key)
    if value is not None and type(value) in kinds and (type(value) is not bool or bool in kinds):
        return value  # the common case, without building the error text
    path = f"{where}{key}"
    if key not in body or body[key] is None:
        expect(not required, f"missing required field '{path}'", path)
        return None
    value = body[key]
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok and float in kinds and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    names = " or ".join(sorted({_TYPE_NAMES.get(k, k.__name__) for k in kinds}))
    expect(ok, f"invalid type for '{path}': expected {names}, got {type_name(value)}", path)
    return value


def require_object(body: Any) -> dict[str, Any]:
    expect(isinstance(body, dict), f"request body must be a JSON object, got {type_name(body)}")
    return body


def parse_arguments(arguments: str) -> tuple[dict[str, Any], str | None]:
    """Tool-call arguments as an object (Anthropic/Google need one); the error when they are not JSON."""
    try:
        value = orjson.loads(arguments) if arguments.strip() else {}
    except ValueError as exc:
        return {}, f"arguments are not valid JSON: {exc}"
    if not isinstance(value, dict):
        return {"value": value}, "arguments are JSON but not an object"
    return value, None
