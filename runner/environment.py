"""The harness's environment: one precedence rule, applied by the session program in every place.

Lowest to highest:

1. the place's base: the sandbox's minimal environment (`tracefleet.runner.sandbox.base_env`: PATH,
   LANG, a fresh HOME/TMPDIR, no telemetry);
2. the preset's defaults (`HarnessLaunch.env`: telemetry off, the model name, CI flags, ...);
3. the user's variables: `spec.harness.env`, exactly as the job gives them (on a pod they arrive as the
   harness container's environment, of which the pod program's own inputs are not part: `user_env`);
4. the session's: every variable the preset points at the session (its value carries the session's
   proxy URL, its secret, or its HOME, where the harness's config files are), and NO_PROXY. A job's env
   cannot route the harness past the proxy or swap its credential.

So a job can change what a preset merely defaults (`NO_COLOR`, `OPENAI_MODEL`, ...), and the proxy
stays the only model endpoint the harness knows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tracefleet.contract.podenv import PREFIX

# Names the pod program's container has for itself (the shell's and the image's HOME), never the user's.
CONTAINER_OWN = ("HOME", "TMPDIR", "PWD", "OLDPWD", "SHLVL", "_")
# Keep loopback (the proxy) direct even if the user sets an HTTP proxy.
ALWAYS_SESSION = ("NO_PROXY", "no_proxy")


@dataclass(frozen=True)
class SessionEndpoint:
    """The proxy session the harness talks to."""

    base_url: str  # proxy root with the session's /s/<id> prefix, no /v1
    api_key: str  # the session's secret


def user_env(env: Mapping[str, str]) -> dict[str, str]:
    """The user's layer from a mapping that may hold a pod program's own inputs (TRACEFLEET_* and the
    container's HOME/TMPDIR/...): those are the runner's, in every place."""
    return {k: v for k, v in env.items() if k not in CONTAINER_OWN and not k.startswith(PREFIX)}


def routes_to_session(key: str, value: str, endpoint: SessionEndpoint, home: str) -> bool:
    """Whether a preset's variable is the session's (layer 4 above)."""
    return (key in ALWAYS_SESSION or (bool(endpoint.base_url) and endpoint.base_url.rstrip("/") in value)
            or (bool(endpoint.api_key) and endpoint.api_key in value) or value == home or value.startswith(home + "/"))


def harness_environment(preset_env: Mapping[str, str], user: Mapping[str, str], endpoint: SessionEndpoint,
                        home: str) -> dict[str, str]:
    """Layers 2-4 (the sandbox adds layer 1 below them)."""
    session = {k: v for k, v in preset_env.items() if routes_to_session(k, v, endpoint, home)}
    return {**preset_env, **user_env(user), **session}
