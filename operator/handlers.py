"""kopf wiring: one timer per RolloutJob runs the level-based reconcile; nothing else does work.

kopf is edge-triggered and has no Lease-based leader election (tracefleet.operator.leader decides which
replica runs this at all), so every decision is made by
`Reconciler.reconcile` from observed state, kopf's own bookkeeping lives in `tracefleet.io/*`
annotations, the finalizer is domain-named, and status is written through `patch.status` (never via
handler return values, which the CRD schema would prune).

Retry intent (the kube helpers raise it): a `kopf.TemporaryError` retries the pass after its delay; a
`kopf.PermanentError` - the API server refused a child built from the spec - fails the job with that
reason instead of stopping the timer (a stopped timer would leave the job Running forever, its
inference never scaled down and its TTL never honoured).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import kopf

from tracefleet.operator import metrics
from tracefleet.operator import names as n
from tracefleet.operator.body import status_of
from tracefleet.operator.events import pass_key
from tracefleet.operator.reconcile import Reconciler, Result
from tracefleet.operator.status import REASON_CHILD_REJECTED, WARNING, failed_status, status_patch

log = logging.getLogger(__name__)

TIMER_EXIT_POLL_S = 1.0  # how often kopf looks whether a deleted job's timer has exited (its finalizer waits)


@dataclass
class OperatorState:
    reconciler: Reconciler
    interval_s: float = 5.0


def run_pass(reconciler: Reconciler, body: Any) -> Result:
    """One reconcile pass; a PermanentError from it becomes the job's Failed status (a TemporaryError
    goes to kopf, which retries after its delay)."""
    try:
        return reconciler.reconcile(body)
    except kopf.PermanentError as e:
        log.error("%s/%s: failing the job: %s", body["metadata"].get("namespace"), body["metadata"].get("name"), e)
        status = failed_status(status_of(body), int(body["metadata"].get("generation") or 0),
                               REASON_CHILD_REJECTED, str(e), reconciler.cfg.recent_batches)
        events = [(WARNING, REASON_CHILD_REJECTED, str(e)[:1024])] if status is not None else []
        return Result(status=status, events=events)


def configure_settings(settings: kopf.OperatorSettings) -> None:
    """kopf's settings for this operator (its startup activity)."""
    settings.persistence.finalizer = n.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=n.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=n.GROUP, key="last-handled-configuration"
    )
    # Reconnect watches that go quiet (the most reported kopf failure: an operator that
    # silently stops hearing events); the timer keeps reconciling regardless.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.watching.inactivity_timeout = 70
    settings.posting.level = logging.WARNING  # only warnings become Kubernetes Events
    settings.execution.max_workers = 16
    settings.networking.request_timeout = 60
    # A RolloutJob deleted while a pass runs (the TTL's own delete is issued from inside the pass) keeps kopf's
    # finalizer until kopf sees the timer exit; it looks again only every `cancellation_polling` s, 60 by
    # default, which left a TTL-deleted job Terminating for a minute on the real node
    # (tests/operator/test_node_faults.py). A pass is seconds long: look again within one.
    settings.background.cancellation_polling = TIMER_EXIT_POLL_S


def build_registry(state: OperatorState) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_settings(settings)

    # backoff: a failed pass (an apiserver hiccup) is retried at the next interval, not after kopf's
    # default 60 s; the pass is level-based, so retrying early is always safe.
    @kopf.timer(n.GROUP, n.VERSION, n.PLURAL, interval=state.interval_s, backoff=max(1.0, state.interval_s),
                registry=registry)
    def reconcile(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger, **_: Any) -> None:
        res = run_pass(state.reconciler, body)
        if res.annotations:
            for k, v in res.annotations.items():
                patch.metadata.annotations[k] = v
        # Events first, then the status kopf writes after this handler: a replica that redoes the pass after
        # a kill in between posts them again under the same names (tracefleet.operator.events), not twice.
        meta = body["metadata"]
        for type_, reason, message in res.events:
            state.reconciler.post_event(meta["namespace"], meta["name"], meta.get("uid", ""), type_, reason, message,
                                        pass_key(meta.get("uid", ""), meta.get("resourceVersion", ""), type_, reason, message))
        if res.status is not None:
            patch.status.update(status_patch(res.status))
        if res.status is not None or res.annotations:
            metrics.API_CALLS.labels("patch", "rolloutjobs").inc()  # kopf sends the one patch; counted as ours
        if res.delete:
            logger.info("ttlSecondsAfterFinished elapsed: deleting %s", body["metadata"]["name"])
            state.reconciler.kube.delete_rolloutjob(body["metadata"]["namespace"], body["metadata"]["name"])

    # A watching handler, not @kopf.on.delete: kopf keeps the last handled spec of an object that has any
    # resource-changing handler in an annotation, and a job's spec may be larger than annotations hold (256 KiB; a
    # 262,144-character prompt is up to 1 MiB, 3 MiB as kopf writes it): every patch of such a job failed, its
    # finalizer was never removed and it could not be deleted (found on the real node).
    @kopf.on.event(n.GROUP, n.VERSION, n.PLURAL, registry=registry)
    def forget(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        if event.get("type") != "DELETED":
            return
        # Children go with ownerReferences (cascading GC); only in-memory caches need dropping.
        state.reconciler.forget(body["metadata"].get("uid", ""))
        if state.reconciler.harness is not None:
            state.reconciler.harness.forget(body["metadata"].get("namespace", ""), body["metadata"]["name"])
        metrics.forget_job(body["metadata"].get("namespace", ""), body["metadata"]["name"])

    return registry
