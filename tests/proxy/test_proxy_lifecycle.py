"""One flight lifecycle (proxy/call.py) for whole and streamed answers: for each reason a call is cut off
(its harness hung up, its session was closed, the proxy is stopping), the whole and the streamed call are
recorded alike (same status and error, with the tokens the engine had produced), counted alike (session
counters, abandoned/cancelled metrics), their engine requests closed, and a harness still connected told in
its dialect: a whole call by an error answer, a streamed one by a final error event.

The proxy app is driven in-process through ASGI (the harness side is this test's receive/send, so that it
can hang up at a chosen moment) in front of the real scripted engine (`tracefleet engine`, a subprocess).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tracefleet.contract.capture import CaptureRecord, read_capture_log
from tracefleet.proxy.app import create_app
from tracefleet.proxy.call import ABANDON_MESSAGES, CLIENT_DISCONNECT, PROXY_SHUTDOWN, SESSION_CLOSED
from tracefleet.proxy.config import ProxyConfig
from tracefleet.proxy.errors import ProxyError

from fixtures.prometheus import metric

ADMIN = "admin-token-for-lifecycle"
LONG = " ".join(f"word{i}" for i in range(100))  # ~200 tokens at 20 ms each: generating for seconds


class Harness:
    """One HTTP exchange as the ASGI server gives it to the app; `hang_up()` is the client going away."""

    def __init__(self, method: str, path: str, body: Any, token: str) -> None:
        raw = orjson.dumps(body) if body is not None else b""
        self.scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                      "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                      "headers": [(b"authorization", f"Bearer {token}".encode()), (b"content-type", b"application/json"),
                                  (b"content-length", str(len(raw)).encode())],
                      "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
        self.raw = raw
        self.sent_body = False
        self.gone = asyncio.Event()  # uvicorn's receive returns http.disconnect once the answer is complete, too
        self.status: int | None = None
        self.body = b""
        self.complete = False

    async def receive(self) -> dict[str, Any]:
        if not self.sent_body:
            self.sent_body = True
            return {"type": "http.request", "body": self.raw, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.gone.is_set() and not self.complete:
            return  # as uvicorn: what is sent to a client that went away is dropped
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")
            if not message.get("more_body", False):
                self.complete = True
                self.gone.set()

    def hang_up(self) -> None:
        self.gone.set()

    async def exchange(self, app: Any) -> Harness:
        await app(self.scope, self.receive, self.send)
        return self


async def cut_off_call(engine: Any, capture: Path, reason: str, stream: bool) -> tuple[CaptureRecord, Harness, dict[str, Any], str]:
    """One chat call cut off for `reason` once the engine has produced a few tokens: its record, what its
    harness received, its session's counters and the proxy's metrics."""
    app = create_app(ProxyConfig(engine_url=engine.url, capture_dir=capture, admin_token=ADMIN, mode="exact",
                                 model_path="smollm2"))
    proxy = app.state.proxy
    try:
        created = await Harness("POST", "/admin/sessions", {"session_id": "s1"}, ADMIN).exchange(app)
        secret = orjson.loads(created.body)["secret"]
        harness = Harness("POST", "/v1/chat/completions", {"model": "m", "stream": stream, "max_tokens": 500,
                                                            "messages": [{"role": "user", "content": "hi"}]}, secret)
        call = asyncio.ensure_future(harness.exchange(app))
        deadline = time.monotonic() + 20
        while not any(len(f.state.completion_ids) >= 3 for f in proxy.flights.by_session.get("s1", ())):
            assert time.monotonic() < deadline and not call.done(), "the engine produced nothing"
            await asyncio.sleep(0.02)
        if reason == CLIENT_DISCONNECT:
            harness.hang_up()
        elif reason == SESSION_CLOSED:
            closed = await Harness("DELETE", "/admin/sessions/s1", None, ADMIN).exchange(app)
            assert closed.status == 200, closed.body
        else:
            assert await proxy.shut_down(2.0) == 1
        await asyncio.wait_for(call, 5.0)
        info = proxy.sessions.get("s1").info().model_dump(exclude={"capture_path"})
        metrics = (await Harness("GET", "/metrics", None, ADMIN).exchange(app)).body.decode()
    finally:
        proxy.sessions.close_all()
        proxy.persist.close()
        await proxy.client.aclose()
    [record] = read_capture_log(capture / "s1.jsonl").records
    return record, harness, info, metrics


@pytest.mark.parametrize("reason", [CLIENT_DISCONNECT, SESSION_CLOSED, PROXY_SHUTDOWN])
def test_whole_and_streamed_calls_are_cut_off_alike(scripted_engine: Any, tmp_path: Path, reason: str) -> None:
    scripted_engine.configure(token_delay_s=0.02, no_tools_text=LONG)
    status = ProxyError(reason, "").status
    seen = {}
    for stream in (False, True):
        record, harness, info, metrics = asyncio.run(
            cut_off_call(scripted_engine, tmp_path / f"cap-{stream}", reason, stream))
        assert record.stream is stream and record.dialect == "openai-chat"
        assert record.error is not None and record.error.kind == reason, record.error
        assert record.error.message == ABANDON_MESSAGES[reason]
        # what the engine had produced is kept, token for token
        assert record.status == "partial" and record.completion_ids and record.output_text.startswith("word0")
        assert len(record.logprobs) == len(record.completion_ids) and record.prompt_ids
        assert record.timings.done_at is not None
        assert (info["calls"], info["errors"], info["abandoned"]) == (1, 1, 1), info
        assert metric(metrics, "tracefleet_proxy_abandoned_calls_total", dialect="openai-chat", reason=reason) == 1
        assert metric(metrics, "tracefleet_proxy_engine_requests_cancelled_total") == 1
        assert metric(metrics, "tracefleet_proxy_calls_total", dialect="openai-chat", status=str(status)) == 1
        deadline = time.monotonic() + 5
        while scripted_engine.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert scripted_engine.running() == 0, "the engine request is still running"
        if reason == CLIENT_DISCONNECT:
            assert not harness.complete  # nobody to tell
        elif stream:  # told by the stream's final event, after the tokens it already had
            assert harness.status == 200 and harness.complete and b"word" in harness.body
            last = harness.body.rstrip().rsplit(b"\n\n", 1)[-1]
            assert last.startswith(b"data: ") and orjson.loads(last[6:])["error"]["code"] == reason, harness.body
        else:  # told by an error answer in its dialect
            assert harness.status == status and orjson.loads(harness.body)["error"]["code"] == reason
        seen[stream] = (record.status, record.error.kind, record.error.message, info)
    assert seen[False] == seen[True]
