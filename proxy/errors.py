"""One error type for everything that can go wrong on a call; each dialect renders it in its own shape."""

from __future__ import annotations

from typing import Literal

ErrorKind = Literal[
    "invalid_request",  # the harness sent something we cannot serve (400)
    "authentication",  # missing/unknown/wrong session credential (401)
    "permission",  # admin token wrong (403)
    "not_found",  # unknown route or session (404)
    "method_not_allowed",  # (405)
    "too_large",  # body over the configured limit (413)
    "rate_limit",  # paused for a weight sync longer than the wait bound (429)
    "context_length",  # the engine refused the prompt as too long (400)
    "engine_4xx",  # the engine rejected the request for another reason (400)
    "engine_5xx",  # the engine failed (502)
    "engine_timeout",  # the engine did not answer in time (504)
    "engine_disconnect",  # the engine went away mid-call (502)
    "engine_unavailable",  # cannot connect to the engine, or it answered 503 (paused, queue full) (503, retryable)
    "engine_aborted",  # the engine aborted the generation (finish_reason "abort": a pause/weight sync) (503, retryable)
    "client_disconnect",  # the harness went away (recorded only)
    "session_closed",  # the runner closed the session with the call in flight (the harness is gone or going)
    "proxy_shutdown",  # the proxy was stopped (SIGTERM, the run ending) with the call in flight (503, retryable)
    "internal",  # a bug in the proxy (500)
]

STATUS_BY_KIND: dict[str, int] = {
    "invalid_request": 400,
    "authentication": 401,
    "permission": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "too_large": 413,
    "rate_limit": 429,
    "context_length": 400,
    "engine_4xx": 400,
    "engine_5xx": 502,
    "engine_timeout": 504,
    "engine_disconnect": 502,
    "engine_unavailable": 503,
    "engine_aborted": 503,
    "client_disconnect": 499,
    "session_closed": 503,
    "proxy_shutdown": 503,
    "internal": 500,
}


class ProxyError(Exception):
    """A call failure with a stable `kind` (metrics, capture log) and an HTTP status for the harness."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        param: str | None = None,
        retry_after: float | None = None,
        limit: str | None = None,
    ) -> None:
        super().__init__(message)
        self.limit = limit  # engine_timeout: which time limit cut the call (tracefleet.contract.engine_limits.Limit)
        self.kind = kind
        self.message = message
        self.status = status if status is not None else STATUS_BY_KIND.get(kind, 500)
        self.param = param
        self.retry_after = retry_after


def invalid(message: str, param: str | None = None) -> ProxyError:
    return ProxyError("invalid_request", message, param=param)
