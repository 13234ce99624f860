"""The SSE transport: a streamed answer written as the token engine produces it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi.responses import Response

from .call import CallContext, Flight, watch_disconnect
from .dialects import StreamWriter
from .errors import ProxyError

if TYPE_CHECKING:
    from .pipeline import Proxy

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class EventStream(Response):
    """A streamed answer: the token engine's events become the dialect's SSE as they arrive.

    The engine's generator is iterated in the request's own task, and events that arrived in one
    read (a `("batch", ...)`) go out in one write. (A pump task + queue per call and Starlette's
    StreamingResponse, with its task group per response, cost ~0.3 ms of CPU per streamed call.)
    What the task group did is done here with less: a watcher task turns the client's disconnect
    into a cancellation, and a timer sends keep-alive pings while the engine is silent.

    An error before any output is a plain HTTP error in the dialect's shape; after that, an error
    event. Either way the capture record is fsync'd before the final event is sent.
    """

    media_type = "text/event-stream"

    def __init__(self, proxy: Proxy, ctx: CallContext) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(_SSE_HEADERS)
        self.proxy, self.ctx = proxy, ctx
        self.dialect, self.state = ctx.dialect, ctx.state
        self.writer: StreamWriter = ctx.dialect.writer(ctx.conv, ctx.state)
        self._send: Any = None
        self._opened = False  # SSE headers sent
        self._started = False  # the dialect's opening event sent
        self._closing = False  # the final event is being sent: no more pings, a disconnect is no longer one
        self.flight: Flight | None = None
        self._last = 0.0  # loop time of the last write
        self._ping: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        proxy = self.proxy
        proxy.in_flight += 1
        loop = asyncio.get_running_loop()
        flight = self.flight = proxy._take_off(self.ctx.session, self.state)
        self._send = send
        self._last = loop.time()
        self._timer = loop.call_at(self._last + proxy.config.keepalive_s, self._tick)
        watcher = loop.create_task(watch_disconnect(receive, flight))
        events = proxy.engine.generate(self.ctx.conv, self.state)
        try:
            await self._stream(events, scope, receive)
        except asyncio.CancelledError:
            # the harness went away, its session ended (or the server is stopping): the partial call is still recorded
            proxy._abandoned(self.ctx, flight)
            if flight.reason is None or flight.task.uncancel() > 0:
                raise
            if flight.reason != "client_disconnect":  # the harness is still there: tell it
                with contextlib.suppress(Exception):
                    await self._fail(self.state.error or ProxyError(flight.reason, ""), scope, receive)
        finally:
            proxy.in_flight -= 1
            self._closing = flight.closing = True
            self._timer.cancel()
            watcher.cancel()
            if self._ping is not None and not self._ping.done():
                self._ping.cancel()
            with contextlib.suppress(BaseException):
                await events.aclose()  # a stream left early (error, disconnect) closes its engine request
            proxy._land(flight)

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

    async def _stream(self, events: AsyncIterator[Any], scope: dict[str, Any], receive: Any) -> None:
        proxy, dialect, state = self.proxy, self.dialect, self.state
        out: list[bytes] = []
        try:
            async for ev in events:
                self._render(ev, out)
                if out:
                    await self._write(out[0] if len(out) == 1 else b"".join(out))
                    out.clear()
        except ProxyError as err:
            error = err
        except Exception as exc:  # a proxy bug must still leave a record and a well-formed answer
            error = ProxyError("internal", f"proxy error: {type(exc).__name__}: {exc}")
        else:
            state.done_at = time.time()
            await proxy._persist(self.ctx)
            try:
                await self._write(self.writer.end(), final=True)  # durable before the final event
            finally:
                proxy._observe(dialect, state, "200")  # off the answer's critical path
            return
        state.error = error
        state.done_at = time.time()
        await proxy._persist(self.ctx)
        proxy._observe(dialect, state, str(error.status))
        await self._fail(error, scope, receive)

    async def _fail(self, error: ProxyError, scope: dict[str, Any], receive: Any) -> None:
        """End the answer with `error`: a plain HTTP error before any output, else the dialect's error event."""
        if self._ping is not None and not self._ping.done():
            await self._ping
        if not self._opened:  # refused before any output
            self._closing = self._opened = True
            await self.proxy.error_response(self.dialect, error, count=False)(scope, receive, self._send)
            return
        await self._write(self.writer.error(error), final=True)
