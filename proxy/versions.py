"""Which policy version sampled each token, learnt from the engine itself (no one calls the proxy on an update).

vLLM >= 0.33 says it per call (`return_weight_versions` -> `weight_versions` spans; the token engines ask
for them). vLLM 0.32 tracks the same spans inside but its OpenAI routes do not return them (only the
`/inference/v1/generate` route, behind `--enable-scale-out`), so on it and on every engine that does not
report spans the proxy infers them:

- the trainer control (tracefleet.trainer.control) labels the engine's weights `VERSION@TIME ...`
  (tracefleet.contract.policy): TIME is taken while generation is paused, after the load and `GUARD_S`
  before the resume;
- every token the proxy receives is timestamped on arrival (`TimedTokens`, the call's `completion_ids`);
- when the call is recorded, its tokens are split at the marks: a token that arrived before a mark's time was
  sampled before that pause (by the older weights), one after it after the resume (by the newer).

One `/weight_info` read covers every call whose last token arrived before the read began, so concurrent
calls share reads (at most one in flight; none at all for calls that ended before the last read). Exact
while the clock skew between the trainer and the proxy stays under each boundary's margin (recorded in the
span as `margin_s`: at least the load time on the old side and the guard on the new). A call answered
whole (no stream, no arrival times) whose run straddles a mark cannot be split: it is flagged
`VERSION_UNKNOWN`, which keeps it out of training. An engine without `/weight_info` (tracefleet's CPU engine,
vLLM without VLLM_SERVER_DEV_MODE) is asked once; the admission version is then all there is.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from tracefleet.contract.policy import VersionMark, decode_label, version_at

from tracefleet.proxy.errors import ProxyError

if TYPE_CHECKING:
    from tracefleet.proxy.engine_client import EngineClient
    from tracefleet.proxy.token_engine import CallState

VERSION_UNKNOWN = "weight_version_unknown"  # capture-record flag: tokens straddle an update, no way to split them
UNLABELLED = "default"  # a span sampled before the oldest mark the label still holds (vLLM's initial label)


class TimedTokens(list):  # type: ignore[type-arg]
    """A call's completion ids, noting when each batch of them arrived: `arrivals` [(count so far, unix time)]."""

    __slots__ = ("arrivals",)

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[tuple[int, float]] = []

    def extend(self, ids: Any) -> None:
        super().extend(ids)
        self.arrivals.append((len(self), time.time()))


class EngineVersions:
    """The engine's version marks, read from its `/weight_info` when a call needs a fresher view."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        self.marks: list[VersionMark] = []
        self.read_at = 0.0  # unix time the last successful read began: marks up to then are known
        self.enabled = True
        self.reads = 0
        self._reading: asyncio.Task[None] | None = None
        self._reading_since = 0.0

    def current(self, admitted: int) -> int:
        """The version a call admitted now runs under: the newest mark known, else the proxy's own."""
        return self.marks[0].version if self.marks else admitted

    async def _read(self) -> None:
        began = time.time()
        try:
            label = await self.client.weight_label()
        except ProxyError as err:
            if err.kind in ("engine_4xx", "engine_5xx"):
                self.enabled = False  # this engine has no such route: never asked again
            return
        self.reads += 1
        self.marks, self.read_at = decode_label(label), began

    async def covering(self, t: float) -> None:
        """Make the marks known up to unix time t: one read that began after t, shared by every call waiting."""
        for _ in range(3):  # a read already in flight may have begun before t: then the next one
            if not self.enabled or self.read_at >= t:
                return
            if self._reading is None or self._reading.done():
                self._reading_since = time.time()
                self._reading = asyncio.get_running_loop().create_task(self._read())
            since = self._reading_since
            await asyncio.shield(self._reading)
            if since >= t:
                return  # covered, or the read failed: what is known is all there is for this call

    async def settle(self, state: CallState) -> None:
        """Stamp the call's version spans once the marks cover its last token (before its record is written)."""
        if state.weight_versions is None and self.enabled and state.completion_ids:
            arrivals = getattr(state.completion_ids, "arrivals", None)
            await self.covering(arrivals[-1][1] if arrivals else (state.done_at or time.time()))
        self.stamp(state)

    def stamp(self, state: CallState) -> None:
        """The call's `weight_versions` from the marks known now (none reported by the engine, none known: nothing)."""
        if state.weight_versions is not None or not self.marks or not state.completion_ids:
            return
        total = len(state.completion_ids)
        arrivals = getattr(state.completion_ids, "arrivals", None)
        if not arrivals or arrivals[-1][0] != total:  # answered whole: sampled somewhere in [sent, done]
            sent = state.engine_sent_at or state.received_at
            first, last = version_at(self.marks, sent), version_at(self.marks, state.done_at or time.time())
            if first != last:
                state.flags.append(VERSION_UNKNOWN)
                return
            arrivals = [(total, state.done_at or time.time())]
        spans: list[dict[str, Any]] = []
        start, prev_t = 0, None
        for count, t in arrivals:
            version = version_at(self.marks, t)
            label = UNLABELLED if version is None else str(version)
            if spans and spans[-1]["version"] == label:
                spans[-1]["end"] = count
            else:
                span: dict[str, Any] = {"version": label, "start": start, "end": count}
                mark = next((m for m in self.marks if m.version == version), None)
                if spans and prev_t is not None and mark is not None:  # how clear the boundary was
                    span["margin_s"] = round(min(mark.at - prev_t, t - mark.at), 4)
                spans.append(span)
            start, prev_t = count, t
        state.weight_versions = spans
