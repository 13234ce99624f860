"""The engine client's own HTTP/1.1 transport against a raw TCP server on loopback: chunked SSE split
at awkward byte boundaries, keep-alive reuse (and retirement before the engine's idle timeout), a request
the engine dropped unanswered sent again once, and each failure mapped to its ProxyError kind."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import orjson
import pytest

from tracefleet.contract.engine_limits import EngineLimits
from tracefleet.proxy.engine_client import ENGINE_KEEPALIVE_S, EngineClient
from tracefleet.proxy.errors import ProxyError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    length = next((int(line.split(":")[1]) for line in head.split("\r\n") if line.lower().startswith("content-length")), 0)
    return head.split(" ")[1], await reader.readexactly(length)


def _sse_wire(events: list[dict]) -> bytes:
    body = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    chunks, pos = [], 0
    for size in (1, 7, 30, 3, 100000):  # chunk sizes that cut events, lines and the [DONE] apart
        part = body[pos:pos + size]
        if part:
            chunks.append(b"%x\r\n" % len(part) + part + b"\r\n")
        pos += size
    return b"".join(chunks) + b"0\r\n\r\n"


async def _serve(handler: Handler) -> tuple[asyncio.AbstractServer, str, list[int]]:
    conns: list[int] = []

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(1)
        try:
            await handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", conns


async def test_chunked_sse_and_json_over_one_kept_alive_connection() -> None:
    events = [{"choices": [{"index": 0, "delta": {"content": f"w{i}\r\n"}, "token_ids": [i]}]} for i in range(5)]
    seen_paths: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            path, body = await _read_request(reader)
            seen_paths.append(path)
            if orjson.loads(body).get("stream"):
                wire = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + _sse_wire(events)
                for i in range(0, len(wire), 5):  # tiny TCP writes
                    writer.write(wire[i:i + 5])
                    await writer.drain()
            else:
                data = orjson.dumps({"ok": True, "echo": orjson.loads(body)})
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(data) + data)
                await writer.drain()

    server, url, conns = await _serve(handler)
    async with server:
        client = EngineClient(url + "/prefix")
        got = [c async for c in client.chat_stream({"stream": True})]
        assert got == events
        assert (await client.chat({"stream": False, "x": 1}))["echo"] == {"stream": False, "x": 1}
        got = [c async for c in client.chat_stream({"stream": True})]
        assert got == events
        await client.aclose()
    assert seen_paths == ["/prefix/v1/chat/completions"] * 3
    assert len(conns) == 1  # one connection, reused


async def test_engine_failures_map_to_error_kinds() -> None:
    async def dies_mid_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _sse_wire([{"choices": []}])[:20])
        await writer.drain()

    async def hangs(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)

    async def rejects(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        data = b'{"error": {"message": "This model\'s maximum context length is 64 tokens"}}'
        writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n" % len(data) + data)
        await writer.drain()

    for handler, kind, stream in ((dies_mid_stream, "engine_disconnect", True), (dies_mid_stream, "engine_disconnect", False),
                                  (hangs, "engine_timeout", True), (rejects, "context_length", False),
                                  (rejects, "context_length", True)):
        server, url, _ = await _serve(handler)
        async with server:
            client = EngineClient(url, limits=EngineLimits(first_token_s=0.5))
            with pytest.raises(ProxyError) as exc:
                if stream:
                    [c async for c in client.chat_stream({"stream": True})]
                else:
                    await client.chat({})
            assert exc.value.kind == kind, (handler.__name__, stream, exc.value)
            await client.aclose()

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ProxyError) as exc:
        await EngineClient(f"http://127.0.0.1:{port}").chat({})
    assert exc.value.kind == "engine_unavailable"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def _paced_engine(tokens: int, gap_s: float, stall_after: int | None = None, first_s: float = 0.0) -> Handler:
    """An engine streaming `tokens` chunks `gap_s` apart after `first_s`, or going silent after `stall_after`."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(first_s)
        for i in range(tokens):
            if i == stall_after:
                await asyncio.sleep(60)
            writer.write(_chunk(b"data: " + orjson.dumps({"choices": [{"index": 0, "text": "x", "token_ids": [i]}]})
                                + b"\n\n"))
            await writer.drain()
            await asyncio.sleep(gap_s)
        writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
    return handler


async def test_time_limits_cut_only_what_they_say() -> None:
    """A stream that keeps producing runs past its first-token and inter-token limits (no total cap by default);
    one that stalls is cut at the inter-token limit, one that never starts at the first-token limit, and a set
    total cap cuts a producing stream: each error names its limit, the tokens before it reached the caller."""
    limits = EngineLimits(first_token_s=0.6, inter_token_s=0.4)
    cases = [(_paced_engine(12, 0.1), limits, None, 12),
             (_paced_engine(12, 0.1, stall_after=3), limits, "inter_token", 3),
             (_paced_engine(3, 0.1, first_s=2.0), limits, "first_token", 0),
             (_paced_engine(30, 0.1), EngineLimits(first_token_s=0.6, inter_token_s=0.4, total_s=1.0), "total", None)]
    for handler, lim, cut, received in cases:
        server, url, _ = await _serve(handler)
        async with server:
            client = EngineClient(url, limits=lim)
            got: list[int] = []
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            try:
                async for chunk in client.completions_stream({"stream": True}):
                    got += chunk["choices"][0]["token_ids"]
                    await asyncio.sleep(0.5 if len(got) == 1 else 0)  # a slow consumer: not the engine's time
                limit = None
            except ProxyError as err:
                assert err.kind == "engine_timeout" and err.status == 504
                limit = err.limit
                assert limit.replace("_", "-") in err.message
            elapsed = loop.time() - t0
            await client.aclose()
        assert limit == cut, (cut, limit, got)
        if received is not None:
            assert len(got) == received, (cut, got)
        if cut is None:
            assert elapsed > lim.first_token_s + lim.inter_token_s  # longer than both limits, not cut
        if cut == "total":
            assert 0.9 < elapsed < 1.6 and 3 < len(got) < 30, (elapsed, got)


async def test_a_request_leaves_no_deadline_timer_behind() -> None:
    """The limits' one timer per request (it wakes only when a deadline could have passed, however many reads
    move it) is gone once the request is: answered whole, streamed to its end, left mid-stream, or cut."""
    loop = asyncio.get_running_loop()

    def deadline_timers() -> list[asyncio.TimerHandle]:
        return [h for h in loop._scheduled if not h.cancelled()  # type: ignore[attr-defined]
                and "_Limits" in getattr(getattr(h, "_callback", None), "__qualname__", "")]

    server, url, _ = await _serve(_paced_engine(6, 0.05))
    async with server:
        client = EngineClient(url, limits=EngineLimits(first_token_s=30, inter_token_s=30))
        assert len([c async for c in client.completions_stream({"stream": True})]) == 6
        assert deadline_timers() == []
        stream = client.completions_stream({"stream": True})
        await anext(stream)
        assert len(deadline_timers()) == 1  # while it is read: one, not one per read
        await stream.aclose()  # the inner generators are closed by the loop's finaliser, a turn or two later
        for _ in range(10):
            await asyncio.sleep(0)
        assert deadline_timers() == []
        await client.aclose()
    server, url, _ = await _serve(_paced_engine(3, 0.1, stall_after=1))
    async with server:
        client = EngineClient(url, limits=EngineLimits(first_token_s=0.5, inter_token_s=0.2))
        with pytest.raises(ProxyError) as cut:
            async for _ in client.completions_stream({"stream": True}):
                pass
        assert cut.value.limit == "inter_token" and deadline_timers() == []
        await client.aclose()


def _answer(writer: asyncio.StreamWriter, stream: bool) -> None:
    if stream:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                     + _sse_wire([{"choices": []}]))
    else:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")


async def _call(client: EngineClient, stream: bool) -> None:
    if stream:
        assert [c async for c in client.completions_stream({"stream": True})] == [{"choices": []}]
    else:
        assert await client.completions({}) == {}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_on_a_connection_the_engine_closes_unanswered_is_sent_again_once(stream: bool) -> None:
    """The race behind `engine_disconnect: Can not write request body`: the engine closes a kept-alive
    connection (its idle timeout) just as the proxy writes the next request onto it. The server here answers
    the first request of each connection and drops the connection at the next one, unanswered."""
    async def closes_at_second_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        _answer(writer, stream)
        await writer.drain()
        await _read_request(reader)  # then writer.close(), no answer

    server, url, conns = await _serve(closes_at_second_request)
    async with server:
        client = EngineClient(url)
        await _call(client, stream)
        await _call(client, stream)  # written onto the kept-alive connection, which the engine drops
        await client.aclose()
    assert len(conns) == 2 and client.resent == 1

    async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)

    server, url, conns = await _serve(never_answers)
    async with server:  # sent twice, no more: then the harness gets the error
        client = EngineClient(url)
        with pytest.raises(ProxyError) as exc:
            await _call(client, stream)
        await client.aclose()
    assert exc.value.kind == "engine_disconnect" and len(conns) == 2 and client.resent == 1


async def test_idle_engine_connections_are_closed_before_the_engines_keep_alive_ends() -> None:
    """uvicorn (vLLM's and the CPU engine's server) closes a connection idle for 5 s: the proxy stops reusing
    one well before, so it never writes onto a connection the engine is closing."""
    uvicorn_keep_alive_s = 5.0
    assert ENGINE_KEEPALIVE_S <= uvicorn_keep_alive_s / 2

    async def keeps_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            _answer(writer, False)
            await writer.drain()

    server, url, conns = await _serve(keeps_alive)
    async with server:
        client = EngineClient(url)
        await _call(client, False)
        await asyncio.sleep(0.2)
        await _call(client, False)
        assert len(conns) == 1  # reused while fresh
        await asyncio.sleep(ENGINE_KEEPALIVE_S + 0.5)
        await _call(client, False)
        await client.aclose()
    assert len(conns) == 2 and client.resent == 0
