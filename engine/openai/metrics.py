"""GET /metrics: Prometheus text with vLLM's names, so that tests and tools read either engine alike."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from tracefleet.engine.openai.serving import engine_of
from tracefleet.engine.protocol import METRICS

router = APIRouter()


@router.get(METRICS)
async def metrics(request: Request) -> Response:
    engine = engine_of(request)
    labels = f'{{engine="0",model_name="{engine.names[0]}"}}'
    text = (f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{labels} {float(engine.running)}\n"
            f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{labels} 0.0\n")
    return Response(text.encode(), media_type="text/plain; version=0.0.4; charset=utf-8")
