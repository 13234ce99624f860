"""Trainer notification: one HMAC-signed POST per sealed batch, delivered off the reconcile path.

Reconciliation only *enqueues*; a small pool of daemon threads does the POSTs with exponential
backoff. When a delivery succeeds, `on_delivered` runs (the operator marks the batch's sealer Job
with an annotation), so after a restart only undelivered batches are sent again. Delivery is
at-least-once: every POST carries a stable `X-Tracefleet-Delivery` id the receiver can dedupe on.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Tracefleet-Signature"
DELIVERY_HEADER = "X-Tracefleet-Delivery"
EVENT_HEADER = "X-Tracefleet-Event"


def signature(secret: bytes, body: bytes) -> str:
    """`sha256=<hex>` of the raw body, GitHub-style, so receivers can reuse existing verifiers."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify_signature(secret: bytes, body: bytes, header: str | None) -> bool:
    return bool(header) and hmac.compare_digest(signature(secret, body), header or "")


@dataclass
class Delivery:
    delivery_id: str  # stable across retries and restarts: "<job uid>/<batch seq>"
    url: str
    payload: dict[str, Any]
    secret: bytes | None = None
    event: str = "batch.sealed"
    on_delivered: Callable[[], None] | None = None
    attempts: int = 0


@dataclass
class WebhookNotifier:
    max_attempts: int = 8
    base_delay_s: float = 0.5
    max_delay_s: float = 60.0
    timeout_s: float = 10.0
    workers: int = 2
    delivered: int = 0
    failed: int = 0
    _queue: "queue.Queue[Delivery | None]" = field(default_factory=queue.Queue)
    _inflight: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> "WebhookNotifier":
        for i in range(self.workers):
            t = threading.Thread(target=self._run, name=f"tracefleet-webhook-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(timeout_s)
        self._threads.clear()

    def submit(self, delivery: Delivery) -> bool:
        """Queue a delivery unless the same id is already queued or being retried. Never blocks."""
        with self._lock:
            if delivery.delivery_id in self._inflight:
                return False
            self._inflight.add(delivery.delivery_id)
        self._queue.put(delivery)
        return True

    def pending(self) -> int:
        with self._lock:
            return len(self._inflight)

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            while True:
                d = self._queue.get()
                if d is None:
                    return
                try:
                    self._deliver(client, d)
                finally:
                    with self._lock:
                        self._inflight.discard(d.delivery_id)

    def _deliver(self, client: httpx.Client, d: Delivery) -> None:
        body = json.dumps(d.payload, sort_keys=True, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", DELIVERY_HEADER: d.delivery_id, EVENT_HEADER: d.event}
        if d.secret:
            headers[SIGNATURE_HEADER] = signature(d.secret, body)
        delay = self.base_delay_s
        while d.attempts < self.max_attempts:
            d.attempts += 1
            try:
                r = client.post(d.url, content=body, headers=headers)
                if r.status_code < 300:
                    self.delivered += 1
                    if d.on_delivered is not None:
                        try:
                            d.on_delivered()
                        except Exception:  # the mark is an optimisation; a resend is dedupable
                            log.exception("marking delivery %s failed", d.delivery_id)
                    return
                # 4xx other than 408/429 will not get better by retrying.
                if 400 <= r.status_code < 500 and r.status_code not in (408, 429):
                    log.warning("webhook %s refused with %s; giving up", d.delivery_id, r.status_code)
                    break
                log.info("webhook %s got %s (attempt %d)", d.delivery_id, r.status_code, d.attempts)
            except httpx.HTTPError as e:
                log.info("webhook %s failed: %s (attempt %d)", d.delivery_id, e, d.attempts)
            time.sleep(delay)
            delay = min(delay * 2, self.max_delay_s)
        self.failed += 1
