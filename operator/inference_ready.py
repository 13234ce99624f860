"""InferenceReady: whether the job's engine can serve its sessions (no session starts before it is).

Managed inference is ready once its Deployment has an available replica; an external engine once it
answers `GET /v1/models` below 500 (probed at most every PROBE_TTL_S per URL)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from tracefleet.contract.job import Condition
from tracefleet.operator.status import (
    COND_INFERENCE_READY,
    REASON_CREATING,
    REASON_DEPLOYMENT_AVAILABLE,
    REASON_DEPLOYMENT_UNAVAILABLE,
    REASON_ENDPOINT_REACHABLE,
    REASON_ENDPOINT_UNREACHABLE,
    REASON_SUSPENDED,
    cond,
)

PROBE_TTL_S = 30.0
PROBE_TIMEOUT_S = 3.0
MODELS_PATH = "/v1/models"

CREATED = cond(COND_INFERENCE_READY, False, REASON_CREATING, "inference Deployment created")


def deployment_condition(deployment: dict[str, Any], want: int, suspended: bool) -> Condition:
    """From the inference Deployment as observed (scaled to `want` replicas)."""
    if suspended:
        return cond(COND_INFERENCE_READY, False, REASON_SUSPENDED, "inference scaled to zero while suspended")
    available = int((deployment.get("status") or {}).get("availableReplicas") or 0)
    if available >= 1:
        return cond(COND_INFERENCE_READY, True, REASON_DEPLOYMENT_AVAILABLE, f"{available}/{want} replicas available")
    return cond(COND_INFERENCE_READY, False, REASON_DEPLOYMENT_UNAVAILABLE,
                "waiting for vLLM to load the model (startup probe on /v1/models)")


@dataclass
class EndpointProbe:
    """Reachability of external engines, remembered PROBE_TTL_S per URL."""

    _seen: dict[str, tuple[float, Condition]] = field(default_factory=dict)

    def condition(self, url: str) -> Condition:
        cached = self._seen.get(url)
        if cached and time.monotonic() - cached[0] < PROBE_TTL_S:
            return cached[1]
        try:
            r = httpx.get(url.rstrip("/") + MODELS_PATH, timeout=PROBE_TIMEOUT_S)
            ok, msg = r.status_code < 500, f"GET {MODELS_PATH} -> {r.status_code}"
        except httpx.HTTPError as e:
            ok, msg = False, f"GET {MODELS_PATH} failed: {e}"
        c = cond(COND_INFERENCE_READY, ok, REASON_ENDPOINT_REACHABLE if ok else REASON_ENDPOINT_UNREACHABLE, msg)
        self._seen[url] = (time.monotonic(), c)
        return c
