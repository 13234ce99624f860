"""The SSE transport: a streamed answer written as the token engine produces it."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from fastapi.responses import Response

from tracefleet.proxy.call import CallContext, Flight, Flights, call_error
from tracefleet.proxy.config import ProxyConfig
from tracefleet.proxy.dialects import DialectCodec, StreamWriter
from tracefleet.proxy.errors import ProxyError


class Streaming(Protocol):
    """What a stream needs of the proxy (tracefleet.proxy.pipeline.Proxy, which makes the streams)."""

    flights: Flights
    config: ProxyConfig

    def error_response(self, dialect: DialectCodec, err: ProxyError, count: bool = True) -> Response: ...

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class EventStream(Response):
    """A streamed answer: the token engine's events become the dialect's SSE as they arrive.

    The engine's generator is iterated in the request's own task, and events that arrived in one
    read (a `("batch", ...)`) go out in one write. (A pump task + queue per call and Starlette's
    StreamingResponse, with its task group per response, cost ~0.3 ms of CPU per streamed call.)
    What the task group did is done here with less: the call's `Flight` (proxy/call.py, as for a whole
    answer) turns the client's disconnect into a cut-off, and a timer sends keep-alive pings while the
    engine is silent.

    An error before any output is a plain HTTP error in the dialect's shape; after that, an error
    event. Either way the capture record is fsync'd before the final event is sent.
    """

    media_type = "text/event-stream"

    def __init__(self, proxy: Streaming, ctx: CallContext) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(_SSE_HEADERS)
        self.proxy, self.ctx = proxy, ctx
        self.dialect, self.state = ctx.dialect, ctx.state
        self.writer: StreamWriter = ctx.dialect.writer(ctx.conv, ctx.state)
        self._scope: Any = None
        self._receive: Any = None
        self._send: Any = None
        self._opened = False  # SSE headers sent
        self._started = False  # the dialect's opening event sent
        self._closing = False  # the final event is being sent: no more pings, a disconnect is no longer one
        self.flight: Flight | None = None
        self._last = 0.0  # loop time of the last write
        self._ping: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        loop = asyncio.get_running_loop()
        self._scope, self._receive, self._send = scope, receive, send
        flight = self.flight = self.proxy.flights.take_off(self.ctx, receive, tell=self._fail)
        self._last = loop.time()
        self._timer = loop.call_at(self._last + self.proxy.config.keepalive_s, self._tick)
        try:
            async with flight:  # a cut-off is recorded, its engine request closed, and the harness told (`_fail`)
                try:
                    await self._stream(flight)
                finally:
                    self._closing = True  # no more pings
                    self._timer.cancel()
        finally:
            if self._ping is not None and not self._ping.done():
                self._ping.cancel()

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        keepalive = self.proxy.config.keepalive_s
        due = self._last + keepalive
        if loop.time() >= due - 0.001 and not self._closing and (self._ping is None or self._ping.done()):
            self._ping = loop.create_task(self._keepalive())
            due = loop.time() + keepalive
        self._timer = loop.call_at(due, self._tick)

    async def _keepalive(self) -> None:
        """Engine silence: open the stream (slow prefill) or ping; runs only while the main task waits."""
        try:
            if not self._opened:
                await self._open(b"")
            else:
                ping = self.writer.ping()
                if ping:
                    await self._send({"type": "http.response.body", "body": ping, "more_body": True})
            self._last = asyncio.get_running_loop().time()
        except Exception:  # noqa: BLE001 - the client is gone; the watcher reports it
            pass

    async def _open(self, body: bytes) -> None:
        self._opened = True
        if not self._started:
            self._started = True
            body = self.writer.start() + body
        await self._send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": True})

    async def _write(self, body: bytes, final: bool = False) -> None:
        if self._ping is not None and not self._ping.done():
            await self._ping  # never interleave with (or overtake) a keep-alive write
        if final:
            self._closing = True
            if self.flight is not None:
                self.flight.closing = True
        if not self._opened:
            if final:
                self._opened = True
                body = (b"" if self._started else self.writer.start()) + body
                self._started = True
                await self._send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            else:
                await self._open(body)
                self._last = asyncio.get_running_loop().time()
                return
        await self._send({"type": "http.response.body", "body": body, "more_body": not final})
        self._last = asyncio.get_running_loop().time()

    def _render(self, ev: Any, out: list[bytes]) -> None:
        kind, value = ev
        writer = self.writer
        if kind == "batch":
            for sub in value:
                self._render(sub, out)
            return
        if not self._started:
            self._started = True  # the engine may skip its opening event: open the message anyway
            out.append(writer.start())
            if kind == "start":
                return
        if kind == "text":
            out.append(writer.text(value))
        elif kind == "reasoning":
            out.append(writer.reasoning(value))
        elif kind == "tool_call":
            out.append(writer.tool_call(value))

    async def _stream(self, flight: Flight) -> None:
        out: list[bytes] = []
        try:
            async for ev in flight.events:
                self._render(ev, out)
                if out:
                    await self._write(out[0] if len(out) == 1 else b"".join(out))
                    out.clear()
        except Exception as exc:
            error = call_error(exc)
        else:
            await flight.record()
            try:
                await self._write(self.writer.end(), final=True)  # durable before the final event
            finally:
                flight.observe()  # off the answer's critical path
            return
        await flight.record(error)
        flight.observe()
        await self._fail(error)

    async def _fail(self, error: ProxyError) -> None:
        """End the answer with `error`: a plain HTTP error before any output, else the dialect's error event."""
        if self._ping is not None and not self._ping.done():
            await self._ping
        if not self._opened:  # refused before any output
            self._closing = self._opened = True
            await self.proxy.error_response(self.dialect, error, count=False)(self._scope, self._receive, self._send)
            return
        await self._write(self.writer.error(error), final=True)
