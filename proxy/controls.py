"""Training controls: pause for a weight sync (new calls wait, then 429), resume, policy version."""

from __future__ import annotations

import asyncio

from tracefleet.proxy.errors import ProxyError


class Controls:
    def __init__(self, *, policy_version: int = 0, max_wait_s: float = 30.0, retry_after_s: int = 5) -> None:
        self.policy_version = policy_version
        self.max_wait_s = max_wait_s
        self.retry_after_s = retry_after_s
        self._resumed = asyncio.Event()
        self._resumed.set()

    @property
    def paused(self) -> bool:
        return not self._resumed.is_set()

    def pause(self, max_wait_s: float | None = None) -> None:
        if max_wait_s is not None:
            self.max_wait_s = max_wait_s
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    async def admit(self) -> int:
        """Wait out a pause (bounded); return the policy version the call runs under."""
        if not self._resumed.is_set():
            try:
                await asyncio.wait_for(self._resumed.wait(), timeout=self.max_wait_s)
            except TimeoutError:
                raise ProxyError("rate_limit", f"the proxy is paused for a policy update; retry after {self.retry_after_s} s",
                                 retry_after=self.retry_after_s) from None
        return self.policy_version

    def state(self) -> dict[str, object]:
        return {"paused": self.paused, "policy_version": self.policy_version, "max_wait_s": self.max_wait_s}
