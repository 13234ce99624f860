"""One call in flight, as the pipeline, the SSE transport and the admin API share it: its context
(session, request, record head, state) and its flight (the task answering it, and why it is being cut off)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from .canonical import Conversation
from .capture import RecordHead
from .dialects import Dialect
from .sessions import Session
from .token_engine import CallState


@dataclass(slots=True)
class CallContext:
    """An admitted call: who made it, in which dialect, what it asks, its record's head and its state."""

    session: Session
    dialect: Dialect
    conv: Conversation
    head: RecordHead
    state: CallState


ABANDON_MESSAGES = {
    "client_disconnect": "the client disconnected before the answer completed",
    "session_closed": "the session was closed while the call was in flight",
    "proxy_shutdown": "the proxy is shutting down; retry the call",
}


@dataclass(eq=False, slots=True)
class Flight:
    """A call in flight: the task answering it, so that a client's disconnect or its session's end can
    cut it off (`reason`), and `landed` once it is recorded and answered."""

    task: asyncio.Task[Any]
    state: CallState
    reason: str | None = None  # why it is being cut off: client_disconnect | session_closed | proxy_shutdown
    closing: bool = False  # its final event is being sent: no longer cut off by a disconnect
    landed: asyncio.Event = field(default_factory=asyncio.Event)


async def watch_disconnect(receive: Any, flight: Flight) -> None:
    """Turn the client's disconnect into a cancellation of the call (its engine request with it).

    Once the request body is read, the server's `receive` returns only when the client goes away
    (or the answer is complete, when this watcher is no longer needed)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    if flight.reason is None and not flight.closing:
        flight.reason = "client_disconnect"
        flight.task.cancel()
