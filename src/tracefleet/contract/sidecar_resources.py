"""What a harness pod's proxy sidecar reserves, per capture mode: the defaults, and how a RolloutJob's
`spec.inference.capture.proxyResources` overrides them.

Measured with bench/sidecar.py (one proxy process serving one session, as in a pod; figures in docs/performance.md):
peak resident memory over an idle start, 400 whole and 400 streamed calls at concurrency 1 and 8, and a
300-turn session whose history grows to ~450 kB (every call sends it all, exact mode keeps its served ids).
  server mode: 67 MiB idle and under load, peak 83 MiB in the long session; 7.4 ms CPU per call at most
  exact mode:  Gemma 3's tokenizer (262k vocabulary, the largest supported family's): 361 MiB idle, peak 377 MiB
               in the long session; SmolLM2's (49k): 100 MiB idle, peak 228 MiB; 26 ms CPU per call at most
               (the long session's calls: the whole history parsed, rendered and recorded each time)
Memory request = peak × 1.25 (what the bench does not drive: one larger request, a slow disk's write queue),
limit = 2 × request (room for a transient, an OOM kill only for a real leak). CPU request = the busiest
phase's CPU per call × 2 calls/s (a session on a fast engine) × 1.25, at least 50m; no CPU limit: a throttled
sidecar adds its wait to every model call. `auto` mode reserves for exact, which it becomes wherever it can.
"""

from __future__ import annotations

from typing import Any

PROXY_RESOURCES: dict[str, dict[str, dict[str, str]]] = {
    "server": {"requests": {"cpu": "50m", "memory": "112Mi"}, "limits": {"memory": "224Mi"}},
    "exact": {"requests": {"cpu": "70m", "memory": "480Mi"}, "limits": {"memory": "960Mi"}},
}


def proxy_resources(capture_mode: str, override: Any = None) -> dict[str, dict[str, Any]]:
    """The sidecar's container resources: the capture mode's defaults (`auto` as exact), with each key the
    override (a RolloutJob's `ResourceRequirements`, or None) gives in place of the default's."""
    defaults = PROXY_RESOURCES["server" if capture_mode == "server" else "exact"]
    given = override.model_dump(mode="json", exclude_none=True) if override is not None else {}
    return {part: {**defaults.get(part, {}), **(given.get(part) or {})} for part in ("requests", "limits")}
