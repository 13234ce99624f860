"""The proxy's engine-facing logic against answers in vLLM's shapes that the real engines here cannot be made
to give on demand: a generation vLLM aborted (`finish_reason: "abort"`, what `/pause?mode=abort` ends
in-flight calls with), a 503 while paused, a stream whose token ids disagree with its usage count, the
"max_tokens too large" 400 of vLLM < 0.33. The answers are shaped as vLLM's; what
vLLM itself does is checked against the real server in tests/vllm/.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response

from tracefleet.contract.capture import read_capture_log
from tracefleet.formats.families import load_model_format
from tracefleet.proxy.exact.engine import ExactTokenEngine
from tracefleet.proxy.canonical import Conversation, Message, Part, Sampling
from tracefleet.proxy.engine_client import EngineClient, unsupported_engine_version
from tracefleet.proxy.errors import ProxyError
from tracefleet.proxy.token_engine import (TOKEN_COUNT_MISMATCH, CallState, ServerTokenEngine, clamp_max_tokens,
                                           reasoning_template_kwargs)

from fixtures.servers import ServedApp, serve_in_thread

MAX_MODEL_LEN = 100
MAX_TOKENS_400 = ("'max_tokens' or 'max_completion_tokens' is too large: 500. This model's maximum context length "
                  "is 100 tokens and your request has 12 input tokens (500 > 100 - 12).")


class VllmShapedEngine:
    """A loopback server answering /v1/models, /version, /tokenize and chat in vLLM's shapes, with the
    outcome of the next generation set by the test; it keeps every request it got."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.finish = "stop"
        self.usage_tokens: int | None = None  # None: the true count
        self.status = 200
        self.retry_after: str | None = None
        self.prompt_len = 12
        self.version = "0.32.0+cpu"
        app = FastAPI()
        app.add_api_route("/v1/models", self.models, methods=["GET"])
        app.add_api_route("/version", self.get_version, methods=["GET"])
        app.add_api_route("/tokenize", self.tokenize, methods=["POST"])
        app.add_api_route("/v1/chat/completions", self.chat, methods=["POST"])
        app.add_api_route("/v1/completions", self.completions, methods=["POST"])
        self.app = app

    async def _keep(self, request: Request) -> dict[str, Any]:
        body = orjson.loads(await request.body()) if request.method == "POST" else {}
        self.requests.append((request.url.path, body, dict(request.headers)))
        return body

    async def models(self, request: Request) -> dict[str, Any]:
        await self._keep(request)
        return {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm", "root": "m",
                                            "max_model_len": MAX_MODEL_LEN}]}

    async def get_version(self, request: Request) -> dict[str, Any]:
        await self._keep(request)
        return {"version": self.version}

    async def tokenize(self, request: Request) -> dict[str, Any]:
        await self._keep(request)
        return {"count": self.prompt_len, "max_model_len": MAX_MODEL_LEN, "tokens": list(range(self.prompt_len))}

    async def chat(self, request: Request) -> Response:
        body = await self._keep(request)
        if self.status != 200:
            headers = {"retry-after": self.retry_after} if self.retry_after else None
            return Response(orjson.dumps({"error": {"message": "paused", "type": "ServiceUnavailableError",
                                                    "param": None, "code": self.status}}),
                            status_code=self.status, headers=headers, media_type="application/json")
        if (body.get("max_tokens") or 0) > MAX_MODEL_LEN - self.prompt_len:
            return Response(orjson.dumps({"error": {"message": MAX_TOKENS_400, "type": "BadRequestError",
                                                    "param": None, "code": 400}}),
                            status_code=400, media_type="application/json")
        ids, lps = [5, 6], [-0.5, -0.25]
        usage = {"prompt_tokens": self.prompt_len, "completion_tokens": self.usage_tokens or len(ids),
                 "total_tokens": self.prompt_len + len(ids)}
        if not body.get("stream"):
            return Response(orjson.dumps({
                "id": "c", "object": "chat.completion", "model": "m", "prompt_token_ids": list(range(self.prompt_len)),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "token_ids": ids,
                             "logprobs": {"content": [{"token": "x", "logprob": lp, "top_logprobs": []} for lp in lps]},
                             "finish_reason": self.finish}], "usage": usage}), media_type="application/json")
        chunks = [{"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                   "prompt_token_ids": list(range(self.prompt_len))}]
        for i, (tid, lp) in enumerate(zip(ids, lps, strict=True)):
            chunks.append({"id": "c", "choices": [{
                "index": 0, "delta": {"content": "h" if i == 0 else "i"}, "token_ids": [tid],
                "logprobs": {"content": [{"token": "x", "logprob": lp, "top_logprobs": []}]},
                "finish_reason": self.finish if i == len(ids) - 1 else None}]})
        chunks.append({"id": "c", "choices": [], "usage": usage})
        data = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        return Response(data, media_type="text/event-stream")

    async def completions(self, request: Request) -> Response:
        """/v1/completions streamed with a token-id prompt (exact mode's route): the ids of "hi" and the
        end-of-turn id, as vLLM stops on it."""
        body = await self._keep(request)
        eot = (body.get("stop_token_ids") or [0])[0]
        steps = [([5], "h", -0.5), ([6], "i", -0.25), ([eot], "", -0.1)]
        chunks = []
        for i, (tids, text, lp) in enumerate(steps):
            choice: dict[str, Any] = {"index": 0, "text": text, "token_ids": tids,
                                      "logprobs": {"tokens": [text], "token_logprobs": [lp], "top_logprobs": [{}],
                                                   "text_offset": [0]},
                                      "finish_reason": self.finish if i == len(steps) - 1 else None}
            if i == 0:
                choice["prompt_token_ids"] = body["prompt"]
            chunks.append({"id": "c", "object": "text_completion", "choices": [choice]})
        chunks.append({"id": "c", "choices": [], "usage": {"prompt_tokens": len(body["prompt"]),
                                                           "completion_tokens": len(steps)}})
        data = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        return Response(data, media_type="text/event-stream")

    def bodies(self, path: str) -> list[dict[str, Any]]:
        return [body for p, body, _ in self.requests if p == path]


@pytest.fixture
def vllm_shaped() -> Iterator[tuple[VllmShapedEngine, ServedApp]]:
    engine = VllmShapedEngine()
    served = serve_in_thread(engine.app)
    yield engine, served
    served.stop()


def _conv(stream: bool, **sampling: Any) -> Conversation:
    return Conversation(messages=[Message(role="user", parts=[Part(type="text", text="hello")])], stream=stream,
                        sampling=Sampling(**sampling))


async def _generate(url: str, conv: Conversation, exact: Any = None, **client: Any) -> CallState:
    engine = exact or ServerTokenEngine(EngineClient(url, **client))
    state = CallState(call_id="c1", session_id="s", dialect="openai-chat", stream=conv.stream, received_at=0.0)
    try:
        async for _ in engine.generate(conv, state):
            pass
    except ProxyError as err:
        state.error = err
    finally:
        await engine.client.aclose()
    return state


def test_clamp_max_tokens() -> None:
    assert clamp_max_tokens(None, 30, 100) == 70  # no max_tokens: all the room left
    assert clamp_max_tokens(500, 30, 100) == 70  # too many: clamped
    assert clamp_max_tokens(20, 30, 100) == 20
    assert clamp_max_tokens(20, 30, None) == 20  # room unknown: as asked
    assert clamp_max_tokens(None, 30, None) is None


def test_version_gate() -> None:
    assert "below the minimum 0.13.0" in (unsupported_engine_version("0.12.0") or "")
    for ok in ("0.13.0", "0.32.0+cpu", "v0.33.0rc1", None, "tracefleet-engine-0.1.0"):
        assert unsupported_engine_version(ok) is None, ok


def test_reasoning_effort_template_kwargs() -> None:
    assert reasoning_template_kwargs(None) == {}
    assert reasoning_template_kwargs("none") == {"reasoning_effort": "none", "enable_thinking": False}
    assert reasoning_template_kwargs("minimal")["enable_thinking"] is True  # as vLLM: only "none" turns it off


@pytest.mark.parametrize("stream", [False, True])
def test_aborted_generation_is_a_retryable_error_not_a_finished_turn(vllm_shaped: Any, stream: bool) -> None:
    engine, served = vllm_shaped
    engine.finish = "abort"
    state = asyncio.run(_generate(served.url, _conv(stream)))
    assert state.error is not None and state.error.kind == "engine_aborted"
    assert state.error.status == 503 and state.error.retry_after is not None


@pytest.mark.parametrize(("finish", "outcome"), [("repetition", "length"), ("length", "length"), ("stop", "stop")])
def test_finish_reasons_map_to_canonical_ones(vllm_shaped: Any, finish: str, outcome: str) -> None:
    engine, served = vllm_shaped
    engine.finish = finish
    for stream in (False, True):
        state = asyncio.run(_generate(served.url, _conv(stream)))
        assert state.error is None and state.finish_reason == outcome, (finish, stream)
        assert state.flags == []


def test_engine_error_finish_is_an_engine_failure(vllm_shaped: Any) -> None:
    engine, served = vllm_shaped
    engine.finish = "error"
    state = asyncio.run(_generate(served.url, _conv(True)))
    assert state.error is not None and state.error.kind == "engine_5xx"


def test_503_is_retryable_with_the_engines_retry_after(vllm_shaped: Any) -> None:
    engine, served = vllm_shaped
    engine.status, engine.retry_after = 503, "7"
    for stream in (False, True):
        state = asyncio.run(_generate(served.url, _conv(stream)))
        assert state.error is not None and (state.error.kind, state.error.status) == ("engine_unavailable", 503)
        assert state.error.retry_after == 7


def test_token_count_mismatch_flags_the_call(vllm_shaped: Any) -> None:
    engine, served = vllm_shaped
    engine.usage_tokens = 3  # the engine sampled 3 tokens but the stream carried 2 (vLLM < 0.13 behind a parser)
    state = asyncio.run(_generate(served.url, _conv(True)))
    assert state.error is None and state.flags == [TOKEN_COUNT_MISMATCH]


def test_max_tokens_too_large_is_clamped_not_a_context_overflow(vllm_shaped: Any) -> None:
    engine, served = vllm_shaped
    for stream in (False, True):
        engine.requests.clear()
        state = asyncio.run(_generate(served.url, _conv(stream, max_tokens=500)))
        assert state.error is None and state.completion_ids == [5, 6], state.error
        sent = [b["max_tokens"] for b in engine.bodies("/v1/chat/completions")]
        # first capped at the context (a prompt has a token), then, after vLLM's 400, at the room the prompt leaves
        assert sent == [MAX_MODEL_LEN - 1, MAX_MODEL_LEN - engine.prompt_len], sent


def test_prompt_that_does_not_fit_is_a_context_overflow(vllm_shaped: Any) -> None:
    engine, served = vllm_shaped
    engine.prompt_len = MAX_MODEL_LEN + 5
    state = asyncio.run(_generate(served.url, _conv(False, max_tokens=10)))
    assert state.error is not None and state.error.kind == "context_length", state.error


def test_engine_api_key_is_sent_on_every_engine_call(vllm_shaped: Any) -> None:
    engine, served = vllm_shaped
    state = asyncio.run(_generate(served.url, _conv(True), api_key="sk-engine"))
    assert state.error is None
    assert {p for p, _, _ in engine.requests} >= {"/v1/models", "/v1/chat/completions"}
    assert all(h.get("authorization") == "Bearer sk-engine" for _, _, h in engine.requests)


def test_server_mode_forwards_reasoning_effort_and_both_reasoning_fields(vllm_shaped: Any) -> None:
    engine, served = vllm_shaped
    conv = _conv(False, reasoning_effort="low", temperature=0.7)
    conv.messages += [Message(role="assistant", parts=[Part(type="reasoning", text="thought"), Part(type="text", text="a")]),
                      Message(role="user", parts=[Part(type="text", text="again")])]
    state = asyncio.run(_generate(served.url, conv))
    (body,) = engine.bodies("/v1/chat/completions")
    assert body["reasoning_effort"] == "low" and body["cache_salt"] == "policy-0"
    assert body["chat_template_kwargs"] == {"reasoning_effort": "low", "enable_thinking": True}
    assert body["messages"][1]["reasoning"] == body["messages"][1]["reasoning_content"] == "thought"
    assert state.sampling == {"temperature": {"value": 0.7, "source": "request"},
                              "top_p": {"value": None, "source": "engine_default"},
                              "top_k": {"value": None, "source": "engine_default"},
                              "seed": {"value": None, "source": "engine_default"},
                              "max_tokens": {"value": None, "source": "engine_default"}}


def test_engine_below_the_minimum_version_fails_calls_with_one_clear_line(vllm_shaped: Any) -> None:
    engine, served = vllm_shaped
    engine.version = "0.11.0"
    state = asyncio.run(_generate(served.url, _conv(False)))
    assert state.error is not None and "vLLM 0.11.0, below the minimum 0.13.0" in state.error.message
    assert not engine.bodies("/v1/chat/completions")


def test_abort_reaches_the_harness_as_a_retryable_error_and_the_record_is_no_finished_turn(
        vllm_shaped: Any, start_proxy: Any) -> None:
    engine, served = vllm_shaped
    engine.finish = "abort"
    proxy = start_proxy(served.url, mode="server")
    secret = proxy.new_session()["secret"]
    r = httpx.post(proxy.url + "/v1/chat/completions", headers={"authorization": f"Bearer {secret}"},
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert r.status_code == 503 and r.headers.get("retry-after"), r.text
    assert r.json()["error"]["code"] == "engine_aborted"
    r = httpx.post(proxy.url + "/v1/messages", headers={"x-api-key": secret, "anthropic-version": "2023-06-01"},
                   json={"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert r.status_code == 503 and r.json()["type"] == "error", r.text
    (log,) = proxy.capture_dir.glob("*.jsonl")
    records = read_capture_log(log).records
    assert [(rec.status, rec.error.kind if rec.error else None) for rec in records] == [("partial", "engine_aborted")] * 2


def test_exact_mode_sends_no_null_max_tokens_and_stops_on_the_end_of_turn(vllm_shaped: Any) -> None:
    engine, served = vllm_shaped
    fmt = load_model_format("smollm2")
    exact = ExactTokenEngine(EngineClient(served.url), fmt)
    state = asyncio.run(_generate(served.url, _conv(True), exact))
    assert state.error is None and state.output_text == "hi" and state.finish_reason == "stop"
    (body,) = engine.bodies("/v1/completions")
    # no max_tokens from the harness: all the room the context leaves (vLLM would otherwise 400 or stop at 16)
    assert body["max_tokens"] == MAX_MODEL_LEN - len(body["prompt"])
    assert body["stop_token_ids"] == [fmt.end_of_turn_id] and body["skip_special_tokens"] is False
    assert exact.sessions["s"].calls  # a finished turn: kept for splicing

    engine.requests.clear()
    state = asyncio.run(_generate(served.url, _conv(True, max_tokens=10_000), exact))
    (body,) = engine.bodies("/v1/completions")
    assert body["max_tokens"] == MAX_MODEL_LEN - len(body["prompt"])  # clamped


def test_exact_mode_aborted_call_is_never_spliced(vllm_shaped: Any) -> None:
    engine, served = vllm_shaped
    engine.finish = "abort"
    exact = ExactTokenEngine(EngineClient(served.url), load_model_format("smollm2"))
    state = asyncio.run(_generate(served.url, _conv(True), exact))
    assert state.error is not None and state.error.kind == "engine_aborted"
    assert not exact.sessions["s"].calls  # the cut turn is not a history a later call may splice onto


def test_exact_mode_prompt_that_does_not_fit_is_a_context_overflow(vllm_shaped: Any) -> None:
    engine, served = vllm_shaped
    exact = ExactTokenEngine(EngineClient(served.url), load_model_format("smollm2"))
    conv = _conv(True)
    conv.messages[0].parts[0].text = "hello " * MAX_MODEL_LEN
    state = asyncio.run(_generate(served.url, conv, exact))
    assert state.error is not None and state.error.kind == "context_length"
    assert not engine.bodies("/v1/completions")


@pytest.mark.parametrize(("message", "param", "kind"), [
    (MAX_TOKENS_400, None, "max_tokens"),  # v0.11-v0.17
    ("This model's maximum context length is 100 tokens. However, you requested 500 output tokens and your prompt "
     "contains at least 12 input tokens, for a total of at least 512 tokens.", None, "max_tokens"),  # v0.20
    ("max_tokens=9000 cannot be greater than max_model_len=8192. Please request fewer output tokens. "
     "(parameter=max_tokens, value=9000)", "max_tokens", "max_tokens"),  # v0.32, as the real server said
    ("This model's maximum context length is 8192 tokens. However, your prompt contains at least 8193 input tokens, "
     "which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. "
     "(parameter=input_tokens, value=8193)", "input_tokens", "context_length"),  # v0.32, as the real server said
    ("This model's maximum context length is 64 tokens. However, your request has 70 input tokens. Please reduce "
     "the length of the input messages.", None, "context_length"),  # v0.11
])
def test_vllm_400s_are_told_apart(message: str, param: str | None, kind: str) -> None:
    from tracefleet.proxy.engine_client import _engine_error, is_max_tokens_error

    err = _engine_error(400, orjson.dumps({"error": {"message": message, "type": "BadRequestError", "param": param,
                                                     "code": 400}}))
    assert (is_max_tokens_error(err) and kind == "max_tokens") or (err.kind == kind == "context_length"), err.kind


def test_proxy_refuses_to_start_on_an_engine_below_the_minimum_version(vllm_shaped: Any, tmp_path: Any) -> None:
    import subprocess
    import sys

    engine, served = vllm_shaped
    engine.version = "0.12.0"
    key_file = tmp_path / "engine-key"
    key_file.write_text("sk-engine\n")
    run = subprocess.run([sys.executable, "-m", "tracefleet", "proxy", "--engine", served.url, "--capture-dir",
                          str(tmp_path / "c"), "--admin-token", "t" * 20, "--port", "0", "--engine-api-key-file",
                          str(key_file)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run
    assert run.stdout.strip().splitlines() == [
        "tracefleet proxy: the engine runs vLLM 0.12.0, below the minimum 0.13.0 (older releases drop streamed "
        "token ids behind tool/reasoning parsers); use a newer vLLM image"], run
    assert run.stderr == ""
    assert [h.get("authorization") for p, _, h in engine.requests if p == "/version"] == ["Bearer sk-engine"]
