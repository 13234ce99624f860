"""Async client for the engine's vLLM-compatible OpenAI API, with errors mapped to ProxyError kinds.

Every generation request asks for `return_token_ids` and per-token `logprobs`: the token ids are
the point of the proxy. aiohttp rather than httpx on this hop: measured here, httpx costs ~0.9 ms
of CPU per engine call and aiohttp ~0.25 ms, and this is the proxy's hottest path. SSE is parsed
from raw byte chunks (not readline) because a first chunk carrying a long prompt's token ids can be
far longer than aiohttp's line limit.

Time limits (tracefleet.contract.engine_limits): connect, first token, between tokens and an optional total,
each for what it says. One asyncio timeout per request is rescheduled as the answer arrives; it is disarmed
while a streamed batch is with the caller (the harness being slow to read is not the engine stalling). A
request cut by a limit raises `engine_timeout` naming the limit, and leaving the response unread closes its
connection, which makes vLLM abort the generation.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from tracefleet.contract.engine_limits import LIMIT_FLAGS, EngineLimits
from tracefleet.vllm import MIN_VLLM_VERSION, version_tuple

from tracefleet.proxy.errors import ProxyError

_CONTEXT_MARKERS = ("context length", "context_length", "maximum context", "too long", "too many tokens")
# vLLM's "prompt + max_tokens does not fit" 400s (v0.11–v0.17: "'max_tokens' or 'max_completion_tokens' is
# too large: N. This model's maximum context length is ..."; v0.20: "... you requested N output tokens and
# your prompt contains at least M input tokens"; v0.32: "max_tokens=N cannot be greater than max_model_len=M",
# param "max_tokens"): the prompt fits, so they are not a context overflow,
# which would make a harness compact a prompt that needs no compacting.
_MAX_TOKENS_MARKERS = ("'max_tokens'", "max_completion_tokens", "output tokens")
_JSON = {"content-type": "application/json"}
_SSE = {"content-type": "application/json", "accept": "text/event-stream"}
RETRY_AFTER_DEFAULT_S = 1
# How long an idle engine connection stays in the pool: shorter than the engine keeps it. vLLM and the CPU
# engine serve with uvicorn, which closes a connection idle for 5 s (its default timeout_keep_alive); a
# request written onto a connection the engine is closing is lost ("Can not write request body", or the
# connection closes with no answer), and a harness that does not retry fails its session on it.
ENGINE_KEEPALIVE_S = 2.0


class EngineModelsUnreadable(RuntimeError):
    """The engine's /v1/models could not be read (not up, not OpenAI-compatible, an error status)."""


def engine_model_cards(engine_url: str, *, api_key: str | None = None, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """/v1/models' cards (`id`; on vLLM and `tracefleet engine` also `root` and `max_model_len`), asked
    synchronously: for start-up decisions (the served name, exact mode's tokenizer) before any event loop runs."""
    import httpx

    url = engine_url.rstrip("/") + "/v1/models"
    headers = {"authorization": f"Bearer {api_key}"} if api_key else None
    try:
        response = httpx.get(url, timeout=timeout_s, headers=headers)
        response.raise_for_status()
        cards = response.json().get("data", [])
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise EngineModelsUnreadable(f"cannot read the served model from {url}: {type(exc).__name__}: {exc}") from exc
    return [c for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str) and c["id"]]


def is_max_tokens_error(err: ProxyError) -> bool:
    """The engine refused max_tokens as too large for the room the prompt leaves (not a prompt overflow)."""
    return err.kind == "engine_4xx" and err.param == "max_tokens"


def _retry_after(value: str | None) -> float:
    try:
        return max(0.0, float(value)) if value else RETRY_AFTER_DEFAULT_S
    except ValueError:  # an HTTP date: not worth parsing, the default is short
        return RETRY_AFTER_DEFAULT_S


def _engine_error(status: int, body: bytes, retry_after: str | None = None) -> ProxyError:
    param = None
    try:
        data = orjson.loads(body)
        err = data.get("error", data) if isinstance(data, dict) else data
        message = err.get("message") if isinstance(err, dict) else None
        param = err.get("param") if isinstance(err, dict) else None
        message = str(message or err)
    except ValueError:
        message = body[:500].decode("utf-8", "replace")
    low = message.lower()
    # vLLM >= 0.2x names the field: param "max_tokens" (too large for the context) or "input_tokens" (overflow)
    overflow = param == "input_tokens" or "without any output tokens" in low  # v0.2x+: the prompt alone is too long
    if status < 500 and not overflow and (param == "max_tokens" or any(m in low for m in _MAX_TOKENS_MARKERS)):
        return ProxyError("engine_4xx", f"engine refused max_tokens ({status}): {message}", param="max_tokens")
    if status < 500 and (overflow or any(m in low for m in _CONTEXT_MARKERS)):
        return ProxyError("context_length", f"prompt exceeds the model's context length: {message}")
    if status == 429:
        return ProxyError("rate_limit", f"engine is overloaded: {message}", retry_after=_retry_after(retry_after))
    if status == 503:  # vLLM: paused for a weight sync, queue full, or another retryable refusal
        return ProxyError("engine_unavailable", f"engine is temporarily unavailable (503): {message}",
                          retry_after=_retry_after(retry_after))
    if status == 401:
        return ProxyError("engine_4xx", f"engine refused the proxy's credentials (401; see --engine-api-key-file): "
                          f"{message}", status=502)
    if 400 <= status < 500:
        return ProxyError("engine_4xx", f"engine rejected the request ({status}): {message}")
    return ProxyError("engine_5xx", f"engine failed ({status}): {message}")


def unsupported_engine_version(version: str | None) -> str | None:
    """Why the engine's version is below MIN_VLLM_VERSION (checked against `/version` when the proxy starts
    and on first use), or None when it is fine or not vLLM's (no version, or a non-numeric one such as
    tracefleet's own engine)."""
    if not version or not version_tuple(version):
        return None
    if version_tuple(version) < version_tuple(MIN_VLLM_VERSION):
        return (f"the engine runs vLLM {version}, below the minimum {MIN_VLLM_VERSION} (older releases drop "
                "streamed token ids behind tool/reasoning parsers); use a newer vLLM image")
    return None


def _error_status(chunk: dict[str, Any]) -> int:
    """The HTTP-like status of an error the engine sent inside a stream (vLLM puts it in `code`)."""
    err = chunk.get("error") if isinstance(chunk.get("error"), dict) else chunk
    code = err.get("code")
    return code if isinstance(code, int) and 400 <= code < 600 else 500


# where each limit is set, for the message a cut call records and the harness reads
_LIMIT_SETTINGS = {"connect": "connectSeconds", "first_token": "firstTokenSeconds",
                   "inter_token": "interTokenSeconds", "total": "totalSeconds"}
_LIMIT_WHAT = {
    "connect": "could not connect to the engine within {s} s",
    "first_token": "the engine sent no token within {s} s of the request",
    "inter_token": "the engine stalled: no token for {s} s after the last one",
    "total": "the call ran past its total limit of {s} s",
}


def limit_error(limit: str, seconds: float) -> ProxyError:
    """A call cut off by one of the engine time limits: which one, and where it is set."""
    what = _LIMIT_WHAT[limit].format(s=f"{seconds:g}")
    return ProxyError("engine_timeout", f"{what} ({limit.replace('_', '-')} limit: spec.inference.engineTimeouts."
                      f"{_LIMIT_SETTINGS[limit]}, {LIMIT_FLAGS[limit]}); the engine request was closed", limit=limit)


def _transport_error(exc: BaseException, started: bool, limits: EngineLimits) -> ProxyError:
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return limit_error("connect", limits.connect_s)
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return ProxyError("engine_timeout", f"engine did not answer in time ({type(exc).__name__})")
    if isinstance(exc, aiohttp.ClientConnectorError) and not started:
        return ProxyError("engine_unavailable", f"cannot reach the engine: {exc}")
    return ProxyError("engine_disconnect", f"engine connection lost mid-call: {type(exc).__name__}: {exc}")


_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
# The connection closed before the engine sent a single byte of an answer: an idle connection the engine
# closed as the request was written (the engine drops it unread). Sent again once, on a new connection.
# (aiohttp itself resends only idempotent methods; every engine call is a POST.) A request the engine did
# read before dropping the connection has no effect the harness could see: nothing was answered, and vLLM
# aborts a request whose connection is gone. A connect failure is not resent: nothing listens.
_CLOSED_UNANSWERED = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


def _carries_output(chunk: dict[str, Any]) -> bool:
    """The chunk holds sampled output (ids, text, a delta other than the role, a finish): the first token came."""
    for choice in chunk.get("choices") or ():
        if choice.get("token_ids") or choice.get("text") or choice.get("finish_reason"):
            return True
        delta = choice.get("delta")
        if delta and any(v for k, v in delta.items() if k != "role"):
            return True
    return False


# A loop timer may wake a little before its time (libuv counts in ms): within this of the deadline, it has passed.
_TIMER_SLACK_S = 0.001


class _Limits:
    """One request's deadlines over one `asyncio.timeout` (`timer`); `limit` names the armed one. The
    first-token deadline is fixed when the request is sent; the inter-token one moves with each read.

    A read only stores the new deadline. One timer handle wakes at the earliest moment the deadline could have
    passed and looks: moved on, it sleeps again until the new one; passed, it makes `timer` expire now, so the
    cancellation and the TimeoutError are asyncio's own. (Rescheduling `timer` on every read made and cancelled
    a loop timer per read, two per streamed batch: bench/proxy_account.py.) `async with` it around the request."""

    __slots__ = ("limits", "timer", "limit", "total_at", "first_at", "deadline", "_loop", "_handle", "_due")

    def __init__(self, limits: EngineLimits) -> None:
        self.limits, self.timer = limits, asyncio.timeout(None)
        self.limit = "first_token"
        self.deadline: float | None = None  # None: disarmed (the caller's time)
        self._handle: asyncio.TimerHandle | None = None
        self._due: float | None = None  # when `_handle` wakes

    async def __aenter__(self) -> _Limits:
        """The request is sent: its clock starts, the first-token deadline armed."""
        await self.timer.__aenter__()
        self._loop = asyncio.get_running_loop()
        now = self._loop.time()
        limits = self.limits
        self.total_at = now + limits.total_s if limits.total_s is not None else None
        self.first_at = now + limits.first_token_s
        self.wait_first()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        """The request is over: no handle outlives it; an expired `timer` turns its cancellation into TimeoutError."""
        self.deadline = None
        if self._handle is not None:
            self._handle.cancel()
            self._due = self._handle = None
        return await self.timer.__aexit__(exc_type, exc, tb)

    def _arm(self, limit: str, at: float) -> None:
        if self.total_at is not None and self.total_at <= at:
            at, limit = self.total_at, "total"
        self.limit, self.deadline = limit, at
        if self._due is None or at < self._due:
            if self._handle is not None:
                self._handle.cancel()
            self._due, self._handle = at, self._loop.call_at(at, self._look)

    def _look(self) -> None:
        self._due = self._handle = None
        at = self.deadline
        if at is None:  # disarmed: the next _arm sets a new handle
            return
        if at > self._loop.time() + _TIMER_SLACK_S:
            self._due, self._handle = at, self._loop.call_at(at, self._look)
        else:
            self.timer.reschedule(self._loop.time())

    def wait_first(self) -> None:
        self._arm("first_token", self.first_at)

    def wait_next(self) -> None:
        self._arm("inter_token", self._loop.time() + self.limits.inter_token_s)

    def disarm(self) -> None:
        self.deadline = None

    def error(self) -> ProxyError:
        seconds = {"first_token": self.limits.first_token_s, "inter_token": self.limits.inter_token_s,
                   "total": self.limits.total_s or 0.0}[self.limit]
        return limit_error(self.limit, seconds)


class EngineClient:
    def __init__(
        self,
        base_url: str,
        *,
        limits: EngineLimits | None = None,
        max_connections: int = 1024,
        api_key: str | None = None,
        logprobs_mode: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # the kind of logprobs the engine reports, as stated to the proxy (None: see engine_logprobs_mode)
        self.logprobs_mode = logprobs_mode
        # vLLM's --api-key: every /v1 route needs `Authorization: Bearer` (401 otherwise)
        auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._json_headers = {**_JSON, **auth}
        self._sse_headers = {**_SSE, **auth}
        self._get_headers = auth or None
        self.limits = limits or EngineLimits()
        # aiohttp times the socket connect; everything after it is timed by _Limits
        self._timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=self.limits.connect_s)
        self._max_connections = max_connections
        self._http: aiohttp.ClientSession | None = None
        self.resent = 0  # requests sent a second time after the engine closed their connection unanswered

    def _session(self) -> aiohttp.ClientSession:
        # created lazily: an aiohttp session belongs to the running event loop
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=self._max_connections,
                                               keepalive_timeout=ENGINE_KEEPALIVE_S),
                timeout=self._timeout, auto_decompress=False, skip_auto_headers=("User-Agent",),
                cookie_jar=aiohttp.DummyCookieJar())  # the engine sets none: skip the per-request cookie filtering
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _response(self, method: str, path: str, data: bytes | None,
                        headers: dict[str, str] | None) -> aiohttp.ClientResponse:
        """The engine's response (status and headers read) to one request; sent a second time when the
        connection closed before any answer (see _CLOSED_UNANSWERED)."""
        try:
            return await self._session().request(method, self.base_url + path, data=data, headers=headers)
        except aiohttp.ClientConnectorError:
            raise
        except _CLOSED_UNANSWERED as first:
            self.resent += 1
            try:
                return await self._session().request(method, self.base_url + path, data=data, headers=headers)
            except aiohttp.ClientConnectorError:
                # the engine took the first connection and is gone now (it died mid-call): that is what happened
                # to this call, not "unreachable"
                raise first from None

    async def _request_json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        limits = _Limits(self.limits)  # a whole answer comes with its first token
        try:
            async with limits:
                async with await self._response(
                    method, path, orjson.dumps(body) if body is not None else None,
                    self._json_headers if body is not None else self._get_headers,
                ) as resp:
                    data = await resp.read()
                    status = resp.status
                    retry_after = resp.headers.get("retry-after")
        except TimeoutError as exc:
            if limits.timer.expired():
                raise limits.error() from exc
            raise _transport_error(exc, started=False, limits=self.limits) from exc
        except _TRANSPORT_ERRORS as exc:
            raise _transport_error(exc, started=False, limits=self.limits) from exc
        if status >= 400:
            raise _engine_error(status, data, retry_after)
        try:
            return orjson.loads(data)
        except ValueError as exc:
            raise ProxyError("engine_5xx", f"engine sent invalid JSON: {exc}") from exc

    async def model_cards(self) -> list[dict[str, Any]]:
        """/v1/models' cards: `id`, and on vLLM `max_model_len`."""
        return list((await self._request_json("GET", "/v1/models")).get("data", []))

    async def models(self) -> list[str]:
        return [m["id"] for m in await self.model_cards()]

    async def version(self) -> str | None:
        """The engine's `/version` (vLLM: `{"version": "0.32.0"}`); None when it has none."""
        try:
            data = await self._request_json("GET", "/version")
        except ProxyError as err:
            if err.kind == "engine_4xx":  # no such route
                return None
            raise
        return str(data.get("version")) if isinstance(data, dict) and data.get("version") else None

    async def check_version(self) -> str | None:
        """The engine's version, or ProxyError when it is a vLLM below MIN_VLLM_VERSION."""
        version = await self.version()
        why = unsupported_engine_version(version)
        if why is not None:
            raise ProxyError("engine_5xx", why)
        return version

    # -- vLLM's RL routes (VLLM_SERVER_DEV_MODE=1 from v0.24): what a trainer's weight sync drives ------------

    async def pause(self, mode: str = "abort") -> Any:
        """vLLM `/pause?mode=abort|wait|keep`: `abort` ends in-flight generations with finish_reason "abort"
        (the proxy reports those calls as retryable errors), `wait` lets them finish, `keep` freezes them
        until `/resume`. New requests wait while paused (v0.32). A trainer's sync (tracefleet.trainer.control)
        uses keep: a kept call resumes under the new weights, and the proxy splits its tokens by version
        (tracefleet.proxy.versions)."""
        return await self._request_json("POST", f"/pause?mode={mode}", {})

    async def resume(self) -> Any:
        return await self._request_json("POST", "/resume", {})

    async def reload_weights(self, weights_path: str) -> Any:
        """New weights from a checkpoint directory, in place (`/collective_rpc` `reload_weights`; measured
        on the v0.32 CPU build: about a second for SmolLM2-135M, and a directory holding only the changed
        tensors is enough)."""
        return await self._request_json("POST", "/collective_rpc", {"method": "reload_weights",
                                                                     "kwargs": {"weights_path": weights_path}})

    async def set_weight_version(self, version: str) -> Any:
        """vLLM's own weight-version label (`/update_weight_version`, read back on `/weight_info`)."""
        return await self._request_json("POST", "/update_weight_version", {"new_version": version})

    async def weight_label(self) -> str:
        """vLLM's weight-version label (`/weight_info`; "default" until a trainer sets one)."""
        return str((await self._request_json("GET", "/weight_info")).get("weight_version"))

    async def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._request_json("POST", "/tokenize", body)

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._request_json("POST", "/v1/chat/completions", body)

    async def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._request_json("POST", "/v1/completions", body)

    def chat_stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        return self.sse_stream("/v1/chat/completions", body)

    def chat_stream_batches(self, body: dict[str, Any]) -> AsyncIterator[list[dict[str, Any]]]:
        return self.sse_batches("/v1/chat/completions", body)

    def completions_stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """/v1/completions streamed (token-id prompts: the exact mode's route)."""
        return self.sse_stream("/v1/completions", body)

    async def sse_stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Yield the engine's SSE chunks as dicts; raise ProxyError on any failure, including a
        stream that ends without `[DONE]` (the engine died)."""
        async for batch in self.sse_batches(path, body):
            for chunk in batch:
                yield chunk

    async def sse_batches(self, path: str, body: dict[str, Any]) -> AsyncIterator[list[dict[str, Any]]]:
        """The engine's SSE chunks, one list per network read: what arrived together can be
        forwarded to the harness in one write (a fast engine sends many chunks per read)."""
        started = False
        done = False
        loads = orjson.loads
        limits = _Limits(self.limits)
        output = False  # the first token has come: the inter-token limit applies from here
        try:
            async with limits:
                async with await self._response("POST", path, orjson.dumps(body), self._sse_headers) as resp:
                    if resp.status >= 400:
                        raise _engine_error(resp.status, await resp.read(), resp.headers.get("retry-after"))
                    started = True
                    buf = b""
                    content = resp.content
                    while data := await content.readany():
                        buf = buf + data if buf else data
                        if b"\n\n" not in buf:
                            if b"\r" not in buf or b"\n\n" not in buf.replace(b"\r\n", b"\n"):
                                continue
                        if b"\r" in buf:
                            buf = buf.replace(b"\r\n", b"\n")
                        *events, buf = buf.split(b"\n\n")
                        if done:
                            continue  # keep reading to the end so the connection is reused
                        batch: list[dict[str, Any]] = []
                        for event in events:
                            for line in event.split(b"\n") if b"\n" in event else (event,):
                                if line[:5] != b"data:":
                                    continue
                                payload = line[5:].strip()
                                if payload == b"[DONE]":
                                    done = True
                                    break
                                try:
                                    chunk = loads(payload)
                                except ValueError as exc:
                                    if batch:
                                        limits.disarm()
                                        yield batch
                                    raise ProxyError("engine_5xx",
                                                     f"engine sent an invalid stream chunk: {exc}") from exc
                                if "choices" not in chunk and ("error" in chunk or chunk.get("object") == "error"):
                                    if batch:
                                        limits.disarm()
                                        yield batch
                                    raise _engine_error(_error_status(chunk), payload)
                                if not output and _carries_output(chunk):
                                    output = True
                                batch.append(chunk)
                            if done:
                                break
                        if batch:
                            limits.disarm()  # the caller's time (writing to the harness) is not the engine's
                            yield batch
                        if output:
                            limits.wait_next()
                        else:
                            limits.wait_first()
        except TimeoutError as exc:
            if limits.timer.expired():
                raise limits.error() from exc
            raise _transport_error(exc, started=started, limits=self.limits) from exc
        except _TRANSPORT_ERRORS as exc:
            raise _transport_error(exc, started=started, limits=self.limits) from exc
        if not done:
            raise ProxyError("engine_disconnect", "engine stream ended before [DONE]")
