"""`tracefleet engine` (llama.cpp) stops within seconds of SIGTERM, also while it streams an answer: uvicorn gives
the stream its graceful-shutdown time (2 s), then cuts it, and the generating thread does not hold the exit.
(The vllm backend's stop is tests/vllm/test_vllm_engine_cli.py's.)"""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx

from fixtures.engines import EngineProcess

STOP_LIMIT_S = 5.0


def test_sigterm_mid_stream_stops_the_llama_engine_within_seconds() -> None:
    engine = EngineProcess(["--model", "smollm2", "--max-model-len", "4096"])
    chunks: list[str] = []

    def stream() -> None:
        body = {"model": engine.model, "messages": [{"role": "user", "content": "Write a long story."}],
                "max_tokens": 3000, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", engine.url + "/v1/chat/completions", json=body, timeout=120) as r:
                chunks.extend(r.iter_lines())
        except httpx.HTTPError:
            pass  # cut off by the stop

    try:
        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        deadline = time.monotonic() + 120
        while len(chunks) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(chunks) >= 3, engine.output  # it is generating
        started = time.monotonic()
        os.kill(engine.process.pid, signal.SIGTERM)
        engine.process.wait(timeout=60)
        took = time.monotonic() - started
        print(f"\nllama.cpp engine: SIGTERM mid-stream -> exit {engine.process.returncode} in {took:.2f} s")
        assert took < STOP_LIMIT_S, (took, engine.output)
    finally:
        engine.stop()
