"""Bench: the proxy's own CPU per model call, piece by piece, in one process (no sockets), for the accounting
of what it adds over a bare relay (bench/proxy.py measures the whole hop).

    .venv/bin/python bench/proxy_parts.py [--calls 5000]

First a whole call through the real ASGI app (`create_app`, server capture mode, Chat Completions, the bench's
request and a 16-token answer), the engine answered in memory (the relay's own work, sockets and HTTP parsing,
is not in it), streamed and not; then each piece of that call timed on its own. CPU time (process_time), the
best of 5 runs: on a shared machine another process's load does not count, only this one's own work.
What the pieces do not add up to is the event loop and the ASGI plumbing between them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_engine import WORDS, logprob  # noqa: E402
from proxy import BODY  # noqa: E402  (bench/proxy.py's request)

TOKENS = 16
SECRET = "tfs-" + "0" * 32
TEXTS = [WORDS[i % len(WORDS)] for i in range(TOKENS)]
PROMPT_IDS = list(range(1, 12))
ANSWER = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake-model",
          "prompt_token_ids": PROMPT_IDS,
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(TEXTS)}, "finish_reason": "stop",
                       "token_ids": list(range(100, 100 + TOKENS)),
                       "logprobs": {"content": [logprob(t) for t in TEXTS]}}],
          "usage": {"prompt_tokens": 11, "completion_tokens": TOKENS, "total_tokens": 11 + TOKENS}}
ANSWER_BYTES = orjson.dumps(ANSWER)


def stream_chunks() -> list[bytes]:
    """The engine's SSE payloads for one streamed answer (what bench/fake_engine.py sends)."""
    head = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake-model"}
    out = [orjson.dumps({**head, "prompt_token_ids": PROMPT_IDS,
                         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})]
    for i, t in enumerate(TEXTS):
        out.append(orjson.dumps({**head, "choices": [{"index": 0, "delta": {"content": t}, "token_ids": [100 + i],
                                                      "logprobs": {"content": [logprob(t)]},
                                                      "finish_reason": "stop" if i == TOKENS - 1 else None}]}))
    out.append(orjson.dumps({**head, "choices": [], "usage": ANSWER["usage"]}))
    return out


CHUNKS = stream_chunks()


class InMemoryEngine:
    """The EngineClient calls a server-mode call makes, answered from memory; parsing as the real client does."""

    logprobs_mode = None

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        orjson.dumps(body)  # what the real client sends
        await asyncio.sleep(0)  # the engine's turn
        return orjson.loads(ANSWER_BYTES)

    async def chat_stream_batches(self, body: dict[str, Any]) -> AsyncIterator[list[dict[str, Any]]]:
        orjson.dumps(body)
        await asyncio.sleep(0)
        yield [orjson.loads(c) for c in CHUNKS[:2]]  # a fast engine's chunks arrive a few per read
        await asyncio.sleep(0)
        yield [orjson.loads(c) for c in CHUNKS[2:10]]
        await asyncio.sleep(0)
        yield [orjson.loads(c) for c in CHUNKS[10:]]

    async def check_version(self) -> None:
        return None

    async def model_cards(self) -> list[dict[str, Any]]:
        return [{"id": "fake-model"}]


HEADERS = [(b"host", b"127.0.0.1:4000"), (b"authorization", f"Bearer {SECRET}".encode()),
           (b"content-type", b"application/json"), (b"user-agent", b"Python/3.11 aiohttp/3.13"),
           (b"accept", b"*/*"), (b"accept-encoding", b"gzip, deflate")]


def asgi_call(app: Any, loop: asyncio.AbstractEventLoop, stream: bool) -> Callable[[], int]:
    """One bench call (bench/proxy.py's request, streamed or not) through an ASGI app, as uvicorn would hand
    it over, run to its end on `loop`; returns the answer's body bytes. The client stays connected."""
    body = orjson.dumps({**BODY, "stream": stream})
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "headers": [*HEADERS, (b"content-length", str(len(body)).encode())], "query_string": b"",
             "http_version": "1.1", "scheme": "http", "root_path": "", "server": ("127.0.0.1", 4000),
             "client": ("127.0.0.1", 5000)}

    async def call() -> int:
        sent = 0
        first = True
        never = loop.create_future()

        async def receive() -> dict[str, Any]:
            nonlocal first
            if first:
                first = False
                return {"type": "http.request", "body": body, "more_body": False}
            await never  # the client stays: only its disconnect would end this
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal sent
            sent += len(message.get("body", b""))

        await app(scope, receive, send)
        return sent

    return lambda: loop.run_until_complete(call())


def best_us(fn: Callable[[], Any], n: int, repeat: int = 5) -> float:
    """CPU µs per call of fn, the best of `repeat` runs of n."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - t0) / n)
    return best * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()
    import uvloop

    from tracefleet.proxy.app import create_app
    from tracefleet.proxy.config import PresetSession, ProxyConfig
    from tracefleet.proxy.dialects.openai_chat import OpenAIChat
    from tracefleet.proxy.metrics import ProxyMetrics
    from tracefleet.proxy.pipeline import api_key
    from tracefleet.proxy.recording import RecordHead, encode_record_line, kept_headers
    from tracefleet.proxy.token_engine import CallState, ServerTokenEngine, sampling_record
    from tracefleet.proxy.versions import TimedTokens

    capture = Path(tempfile.mkdtemp(prefix="tf-parts-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    engine = ServerTokenEngine(InMemoryEngine(), "fake-model")  # type: ignore[arg-type]
    app = create_app(ProxyConfig(engine_url="http://engine", capture_dir=capture, admin_token="a" * 16,
                                 sessions=[PresetSession(session_id="bench", secret=SECRET)]), token_engine=engine)
    proxy = app.state.proxy
    proxy.versions.enabled = False  # as on an engine without /weight_info (the bench's fake engine)
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)

    n = args.calls
    rows: list[tuple[str, float]] = []
    whole, streamed = best_us(asgi_call(app, loop, False), n), best_us(asgi_call(app, loop, True), n)
    empty = best_us(lambda: loop.run_until_complete(asyncio.sleep(0)), n)

    body = orjson.loads(orjson.dumps(BODY))
    raw = orjson.dumps(BODY)
    chat = OpenAIChat()
    conv = chat.parse(body)
    session = proxy.sessions.get("bench")

    def state() -> CallState:
        return CallState(call_id=os.urandom(12).hex(), session_id="bench", dialect=chat.name, stream=False,
                         received_at=time.time(), requested_model="fake-model", completion_ids=TimedTokens())

    async def answered() -> CallState:
        s = state()
        async for _ in engine.generate(conv, s):
            pass
        return s

    done = loop.run_until_complete(answered())
    head = RecordHead(done, conv=conv, request=body, request_ref=None, headers=kept_headers(HEADERS), mode="server",
                      engine_url="http://engine")
    head.encode()
    metrics = ProxyMetrics()

    def observe() -> None:
        m = metrics
        m.calls.labels(chat.name, "200").inc()
        m.prompt_tokens.labels(chat.name).inc(11)
        m.completion_tokens.labels(chat.name).inc(TOKENS)
        m.ttft.labels(chat.name).observe(0.001)
        m.latency.labels(chat.name).observe(0.001)

    line = encode_record_line(head, done, None)
    sconv = chat.parse({**body, "stream": True})

    async def streamed_events() -> list[Any]:
        st = state()
        return [ev async for ev in engine.generate(sconv, st)]

    events = loop.run_until_complete(streamed_events())

    def render() -> bytes:
        writer = chat.writer(sconv, done)
        out = [writer.start()]
        for kind, value in events:
            for k, v in (value if kind == "batch" else [(kind, value)]):
                if k == "text":
                    out.append(writer.text(v))
        out.append(writer.end())
        return b"".join(out)

    rows += [
        ("authenticate (credential headers, session lookup)", best_us(lambda: proxy.sessions.authenticate(api_key({"headers": HEADERS}), None), n)),
        ("request JSON parse (orjson)", best_us(lambda: orjson.loads(raw), n)),
        ("dialect parse into the canonical model (pydantic)", best_us(lambda: chat.parse(body), n)),
        ("call state + call id", best_us(state, n)),
        ("record head (kept headers, fields)", best_us(lambda: RecordHead(done, conv=conv, request=body, request_ref=None,
                                                                           headers=kept_headers(HEADERS), mode="server",
                                                                           engine_url="http://engine"), n)),
        ("engine request body + sampling record", best_us(lambda: sampling_record(conv, loop.run_until_complete(engine._body(conv, False))), n) - empty),
        ("engine answer: generate + token ids/logprobs (incl. JSON parse)", best_us(lambda: loop.run_until_complete(answered()), n) - empty),
        ("record head encode (canonical model_dump + orjson; during the engine wait)",
         best_us(lambda: RecordHead(done, conv=conv, request=body, request_ref=None, headers={}, mode="server",
                                    engine_url="http://engine").encode(), n)),
        ("record tail encode", best_us(lambda: encode_record_line(head, done, None), n)),
        ("capture append + fsync (tmpfs)", best_us(lambda: session.append_encoded(line, 1, 0), n)),
        ("answer in the dialect (dict + orjson)", best_us(lambda: orjson.dumps(chat.response(conv, done)), n)),
        ("metrics (5 observations)", best_us(observe, n)),
    ]
    stream_rows = [
        (f"streamed: {len(CHUNKS)} engine chunks -> text, token ids, logprobs (incl. JSON parse)",
         best_us(lambda: loop.run_until_complete(streamed_events()), n) - empty),
        (f"streamed: the answer's SSE events in the dialect ({TOKENS} deltas + start + end)", best_us(render, n)),
    ]
    print(f"# in-process, server mode, Chat Completions, {TOKENS}-token answer; CPU µs per call (best of 5 x {n}); "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'whole call through the ASGI app, not streamed':<80} {whole:8.1f}")
    print(f"{'whole call through the ASGI app, streamed (3 engine reads)':<80} {streamed:8.1f}")
    print(f"{'  (one event-loop turn, subtracted from the async pieces)':<80} {empty:8.1f}")
    for name, us in rows:
        print(f"{'  ' + name:<80} {us:8.1f}")
    print(f"{'  sum of the pieces':<80} {sum(us for _, us in rows):8.1f}")
    for name, us in stream_rows:
        print(f"{'  ' + name:<80} {us:8.1f}")
    proxy.sessions.close_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
