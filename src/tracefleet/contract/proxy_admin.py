"""The proxy's admin API (runner, operator -> proxy): its routes, request bodies and answers.

The proxy validates what it is sent with these models (`tracefleet.proxy.admin`) and its client reads the
answers with them (`tracefleet.runner.proxy_admin`). Requests are strict (a version given as "9" is refused,
not coerced); answers ignore fields they do not know, so an older client reads a newer proxy.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr


class AdminPath:
    """The admin API's routes (all under a Bearer admin token)."""

    SESSIONS = "/admin/sessions"  # POST: create a session
    PAUSE = "/admin/pause"
    RESUME = "/admin/resume"
    POLICY_VERSION = "/admin/policy-version"
    STATE = "/admin/state"

    @staticmethod
    def session(session_id: str) -> str:
        """GET: the session's counters; DELETE: close it (its calls in flight cut off and recorded)."""
        return f"{AdminPath.SESSIONS}/{session_id}"


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CreateSession(_Request):
    """POST /admin/sessions. Everything optional: the proxy makes up an id and a secret."""

    session_id: StrictStr | None = None
    secret: StrictStr | None = Field(default=None, min_length=16)  # as the proxy makes them: guessing one is out of reach
    metadata: dict[str, Any] | None = None
    # the session's first N calls are answered by the proxy's guide engine (ProxyConfig.guide_url) and recorded
    # `guided`: a guided prefix, context for the calls the policy answers after it
    guided_calls: StrictInt = Field(default=0, ge=0)


class Pause(_Request):
    """POST /admin/pause: new calls wait (at most `max_wait_s`, then 429) until resumed."""

    max_wait_s: float | None = Field(default=None, ge=0, strict=True)  # strict still takes an int, not a bool


class SetPolicyVersion(_Request):
    """POST /admin/policy-version: the version every call admitted from now on records."""

    version: StrictInt = Field(ge=0)


class ProxySession(_Answer):
    """A session as the proxy keeps it (GET and DELETE /admin/sessions/<id>)."""

    session_id: str
    calls: int = 0
    errors: int = 0
    abandoned: int = 0  # calls cut off in flight (harness gone, session closed, proxy stopping); also in `errors`
    capture_path: str | None = None
    active: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)
    guided_calls: int = 0  # as created: how many of its first calls the guide answers


class RegisteredSession(ProxySession):
    """POST /admin/sessions' answer: the session, its secret (the harness's API key) and its URL prefix."""

    secret: str
    base_path: str


class ControlsState(_Answer):
    """The training controls (answer of pause, resume and policy-version)."""

    paused: bool
    policy_version: int
    max_wait_s: float


class ProxyState(ControlsState):
    """GET /admin/state."""

    active_sessions: int
