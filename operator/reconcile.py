"""One level-based reconcile of a RolloutJob: observe children, act a bounded amount, report.

Driven by a kopf timer (handlers.py), never by edge events: whatever happened while the operator
was down is simply observed on the next pass. Per pass: one pod list and one Job list by label
selector, one Deployment get (managed inference), then at most `max_creates_per_reconcile`
creates/deletes and a few batch-manifest reads. State lives in the cluster (children and their
annotations) and the bucket; the in-memory caches below only save repeat calls.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import httpx
import kopf
from pydantic import ValidationError

from tracefleet.contract.semantics import DiagnosticsCounts, groups_per_batch, next_batches, session_plan
from tracefleet.contract.layout import batch_id_for
from tracefleet.contract.harbor import HARBOR_NOT_YET

from . import bucketio, metrics
from .children.harness import exact_mode_problem, harness_pod
from .children.inference import inference_deployment, inference_service
from .children.jobs import evaluator_job, sealer_job
from .children.network_policy import harness_network_policy
from . import names as n
from .kube import Kube
from .sessions import job_condition, observe, plan
from .status import (
    COND_INFERENCE_READY,
    EVENT_BATCH_SEALED,
    FINISHED_PHASES,
    NORMAL,
    REASON_CREATING,
    REASON_DEPLOYMENT_AVAILABLE,
    REASON_DEPLOYMENT_UNAVAILABLE,
    REASON_ENDPOINT_REACHABLE,
    REASON_ENDPOINT_UNREACHABLE,
    REASON_INVALID_SPEC,
    REASON_SUSPENDED,
    Cond,
    Progress,
    SessionCounts,
    build_status,
    calculate_status,
    condition_events,
    failed_status,
    quarantine_condition,
    status_changed,
)
from .view import JobView, OperatorConfig
from .webhook import Delivery, WebhookNotifier

log = logging.getLogger(__name__)

ANNOTATION_SPEC_HASH = "tracefleet.io/immutable-spec"
ANNOTATION_BATCH = "tracefleet.io/batch"
# Fields whose change would make finished sessions and sealed batches inconsistent with the spec.
IMMUTABLE_SPEC_FIELDS = ("inference", "harness", "tasks", "evaluator", "output")


@dataclass
class Result:
    status: dict[str, Any] | None = None  # None: unchanged, skip the write
    annotations: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    delete: bool = False
    api_calls: int = 0


def pending_seqs(sealers: list[dict[str, Any]]) -> set[int]:
    """Bucket seqs already attributed to some sealer Job (recorded in its annotation)."""
    out = set()
    for sj in sealers:
        ann = (sj["metadata"].get("annotations") or {}).get(ANNOTATION_BATCH)
        if ann:
            out.add(int(json.loads(ann)["seq"]))
    return out


def immutable_hash(spec: dict[str, Any]) -> str:
    part = {k: spec.get(k) for k in IMMUTABLE_SPEC_FIELDS}
    return hashlib.sha256(json.dumps(part, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class Reconciler:
    kube: Kube
    cfg: OperatorConfig = field(default_factory=OperatorConfig)
    notifier: WebhookNotifier | None = None
    _ensured: dict[str, set[str]] = field(default_factory=dict)
    _task_ids: dict[str, list[str]] = field(default_factory=dict)
    _made_calls: dict[tuple[str, int, int], bool] = field(default_factory=dict)
    _secrets: dict[tuple[str, str], dict[str, str] | None] = field(default_factory=dict)
    _reach: dict[str, tuple[float, bool, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ------------------------------------------------------------------ entry

    def reconcile(self, body: Any, now: datetime | None = None) -> Result:
        started = time.monotonic()
        calls0 = self.kube.calls
        try:
            return self._reconcile(body, now or datetime.now(timezone.utc))
        except Exception as e:
            metrics.RECONCILE_ERRORS.labels(type(e).__name__).inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
            log.debug("reconcile took %d API calls", self.kube.calls - calls0)

    def forget(self, uid: str) -> None:
        self._ensured.pop(uid, None)
        self._task_ids.pop(uid, None)
        for key in [k for k in self._made_calls if k[0] == uid]:
            del self._made_calls[key]

    # ------------------------------------------------------------------ the pass

    def _reconcile(self, body: Any, now: datetime) -> Result:
        res = Result()
        meta = body["metadata"]
        old_status: dict[str, Any] = dict(body.get("status") or {})
        generation = int(meta.get("generation") or 0)
        try:
            job = JobView.from_body(body)
        except ValidationError as e:  # the CRD should have refused it; report instead of crash-looping
            res.status = self._fail_status(old_status, generation, REASON_INVALID_SPEC, str(e)[:1000], now)
            return res
        if job.managed_by and job.managed_by != "tracefleet.io/operator":
            return res  # another controller (e.g. MultiKueue) owns it

        # Immutable fields: remember what the job started with; refuse later changes by condition.
        spec_hash = immutable_hash(dict(body["spec"]))
        recorded = (meta.get("annotations") or {}).get(ANNOTATION_SPEC_HASH)
        if recorded is None:
            res.annotations[ANNOTATION_SPEC_HASH] = spec_hash
        spec_rejected = recorded is not None and recorded != spec_hash

        finished_phase = old_status.get("phase") in FINISHED_PHASES
        if finished_phase:
            return self._after_finish(job, old_status, now, res)

        problems: list[str] = []
        if not job.harness.image:
            problems.append("spec.harness.image is required on Kubernetes")
        if job.evaluator is not None and not job.evaluator.image:
            problems.append("spec.evaluator.image (or spec.harness.image) is required on Kubernetes")
        if (problem := exact_mode_problem(job)) is not None:
            problems.append(problem)
        if job.tasks_harbor is not None:
            problems.append(HARBOR_NOT_YET)
        if problems:
            res.status = self._fail_status(old_status, generation, REASON_INVALID_SPEC, "; ".join(problems), now)
            return res

        task_ids = self._task_ids_of(job)
        total = len(task_ids) * job.samples_per_task
        budget = self.cfg.max_creates_per_reconcile

        # --- inference
        inf_ready, inf_reason, inf_msg, budget = self._inference(job, budget)

        # --- observe sessions
        pods = self.kube.list_pods(job.namespace, n.job_selector(job.name, n.COMPONENT_HARNESS))
        jobs = self.kube.list_jobs(job.namespace, n.job_selector(job.name))
        evals = [j for j in jobs if (j["metadata"].get("labels") or {}).get(n.LABEL_COMPONENT) == n.COMPONENT_EVALUATOR]
        sealers = [j for j in jobs if (j["metadata"].get("labels") or {}).get(n.LABEL_COMPONENT) == n.COMPONENT_SEALER]
        table = observe(total, pods, evals)
        may_start = inf_ready and not job.suspend and not spec_rejected
        p = plan(
            table,
            has_evaluator=job.evaluator is not None,
            parallelism=job.parallelism,
            max_retries=job.max_retries,
            now=now.timestamp(),
            backoff_base_s=self.cfg.retry_backoff_s,
            backoff_cap_s=self.cfg.retry_backoff_max_s,
            may_start=may_start,
            made_calls=lambda s: self._session_made_calls(job, s, table.failures.get(s, 0)),
        )

        # --- suspend: running sessions go away (Kueue preemption semantics); they rerun on resume
        if job.suspend:
            for plist in table.alive.values():
                for pod in plist:
                    if budget <= 0:
                        break
                    self.kube.delete_pod(job.namespace, pod["metadata"]["name"])
                    budget -= 1

        # --- network policy once per job (per operator process)
        ensured = self._ensured.setdefault(job.uid, set())  # one reference (see _after_finish)
        if "netpol" not in ensured and budget > 0:
            self.kube.create(harness_network_policy(job))
            ensured.add("netpol")
            budget -= 1

        # --- harness pods and evaluator Jobs
        batch_pods = [harness_pod(job, self.cfg, s, a) for s, a in p.need_pod[: max(0, budget)]]
        budget -= len(batch_pods)
        created_pods = sum(self.kube.create_many(batch_pods))
        metrics.CHILDREN_CREATED.labels(n.COMPONENT_HARNESS).inc(created_pods)
        if job.evaluator is not None:
            evals_new = [evaluator_job(job, self.cfg, s) for s in p.need_eval[: max(0, budget)]]
            budget -= len(evals_new)
            metrics.CHILDREN_CREATED.labels(n.COMPONENT_EVALUATOR).inc(sum(self.kube.create_many(evals_new)))

        # --- sealing: fixed session sets per batch, recorded on the sealer Job itself
        batches, seal_failed, unsealed, budget = self._batches(job, task_ids, sealers, p.succeeded, p.failed, budget, res)

        # --- counters, phase, conditions
        # what the diagnostics made of the sealed sessions, from the recorded manifests (as `tracefleet run` counts)
        diagnosed = sum((DiagnosticsCounts.from_json(b.get("diagnostics")) for b in batches), DiagnosticsCounts())
        counts = SessionCounts(
            total=total,
            running=p.running + created_pods,
            succeeded=len(p.succeeded),
            failed=len(p.failed),
            traces=sum(b.get("traces", 0) for b in batches),
            tokens=sum(b.get("tokens", 0) for b in batches),
            judged=diagnosed.judged,
            quarantined=diagnosed.quarantined,
            dropped=diagnosed.dropped,
        )
        counts.pending = max(0, total - counts.running - counts.succeeded - counts.failed)
        refused = (f"changes to spec.{{{','.join(IMMUTABLE_SPEC_FIELDS)}}} are not applied; revert them or create a new RolloutJob"
                   if spec_rejected else "")
        obs = calculate_status(Progress(
            generation=job.generation,
            counts=counts,
            inference=Cond(COND_INFERENCE_READY, inf_ready, inf_reason, inf_msg),
            batches=batches,
            spec_rejected=refused,
            seal_failed=seal_failed,
            unsealed=unsealed,
            suspended=job.suspend,
            terminating=table.terminating,
            quarantine=quarantine_condition(diagnosed, job.diagnostics_policy.max_quarantine_rate,
                                            job.diagnostics_policy.min_judged_sessions),
        ))
        new_status = build_status(old_status, obs, min(self.cfg.recent_batches, 10), now)
        res.events += condition_events(old_status.get("conditions"), new_status["conditions"])
        if status_changed(old_status, new_status):
            res.status = new_status
        metrics.record_job(job.namespace, job.name, obs.phase, counts.as_status(), diagnosed)
        return res

    # ------------------------------------------------------------------ pieces

    def _fail_status(self, old: dict[str, Any], generation: int, reason: str, message: str, now: datetime) -> dict[str, Any] | None:
        return failed_status(old, generation, reason, message, self.cfg.recent_batches, now)

    def _after_finish(self, job: JobView, old: dict[str, Any], now: datetime, res: Result) -> Result:
        """Finished jobs: nothing runs; scale inference to zero, then honour ttlSecondsAfterFinished."""
        # one reference to the set: the deletion handler (another thread) may drop the job's entry meanwhile
        ensured = self._ensured.setdefault(job.uid, set())
        if job.managed is not None and "scaled-down" not in ensured:
            dep = self.kube.get_deployment(job.namespace, n.inference_name(job.name))
            if dep and (dep.get("spec") or {}).get("replicas", 0) != 0:
                self.kube.scale_deployment(job.namespace, n.inference_name(job.name), 0)
            ensured.add("scaled-down")
        if job.ttl_after_finished_s is not None and old.get("completionTime"):
            done = datetime.fromisoformat(old["completionTime"].replace("Z", "+00:00"))
            if (now - done).total_seconds() >= job.ttl_after_finished_s:
                res.delete = True
        self._resend_undelivered(job, res)
        return res

    def _task_ids_of(self, job: JobView) -> list[str]:
        """The job's task ids, in order (tasks from a ConfigMap or URI are read once per operator process)."""
        if job.tasks_inline is not None:
            return [str(t["id"]) for t in job.tasks_inline]
        key = f"{job.uid}"
        if key not in self._task_ids:
            text: str | None = None
            if job.tasks_configmap:
                cm = self.kube.get_configmap(job.namespace, job.tasks_configmap[0])
                text = ((cm or {}).get("data") or {}).get(job.tasks_configmap[1])
            elif job.tasks_uri:
                creds = self._secret(job.namespace, job.credentials_secret) if job.credentials_secret else None
                text = bucketio.read_text(job.tasks_uri, creds)
            if text is None:
                # the ConfigMap or the object may be created after the job: look again later
                raise kopf.TemporaryError(f"tasks of {job.namespace}/{job.name} not found", delay=30)
            self._task_ids[key] = [str(json.loads(line)["id"]) for line in text.splitlines() if line.strip()]
        return self._task_ids[key]

    def _session_made_calls(self, job: JobView, session: int, failures: int) -> bool:
        """Whether the session's latest failed attempt made a model call (its uploaded capture log is not
        empty): then the failure is data and is not retried. Read once per failure."""
        key = (job.uid, session, failures)
        if key not in self._made_calls:
            creds = self._secret(job.namespace, job.credentials_secret) if job.credentials_secret else None
            self._made_calls[key] = bucketio.session_made_calls(job.bucket_uri, job.name, session, creds, job.bucket_endpoint)
        return self._made_calls[key]

    def _secret(self, ns: str, name: str) -> dict[str, str] | None:
        key = (ns, name)
        if key not in self._secrets or self._secrets[key] is None:
            self._secrets[key] = self.kube.get_secret_data(ns, name)
        return self._secrets[key]

    def _inference(self, job: JobView, budget: int) -> tuple[bool, str, str, int]:
        if job.managed is None:
            return (*self._reachable(job.external_url or ""), budget)
        ensured = self._ensured.setdefault(job.uid, set())
        name = n.inference_name(job.name)
        if "service" not in ensured:
            self.kube.create(inference_service(job))
            ensured.add("service")
            budget -= 1
        dep = self.kube.get_deployment(job.namespace, name)
        if dep is None:
            self.kube.create(inference_deployment(job))
            metrics.CHILDREN_CREATED.labels(n.COMPONENT_INFERENCE).inc()
            return False, REASON_CREATING, "inference Deployment created", budget - 1
        want = 0 if job.suspend else job.managed.replicas
        if (dep.get("spec") or {}).get("replicas") != want:
            self.kube.scale_deployment(job.namespace, name, want)
            budget -= 1
        if job.suspend:
            return False, REASON_SUSPENDED, "inference scaled to zero while suspended", budget
        available = int((dep.get("status") or {}).get("availableReplicas") or 0)
        if available >= 1:
            return True, REASON_DEPLOYMENT_AVAILABLE, f"{available}/{want} replicas available", budget
        return False, REASON_DEPLOYMENT_UNAVAILABLE, "waiting for vLLM to load the model (startup probe on /v1/models)", budget

    def _reachable(self, url: str) -> tuple[bool, str, str]:
        cached = self._reach.get(url)
        if cached and time.monotonic() - cached[0] < 30:
            return (cached[1], REASON_ENDPOINT_REACHABLE if cached[1] else REASON_ENDPOINT_UNREACHABLE, cached[2])
        try:
            r = httpx.get(url.rstrip("/") + "/v1/models", timeout=3.0)
            ok, msg = r.status_code < 500, f"GET /v1/models -> {r.status_code}"
        except httpx.HTTPError as e:
            ok, msg = False, f"GET /v1/models failed: {e}"
        self._reach[url] = (time.monotonic(), ok, msg)
        return ok, REASON_ENDPOINT_REACHABLE if ok else REASON_ENDPOINT_UNREACHABLE, msg

    def _batches(
        self,
        job: JobView,
        task_ids: list[str],
        sealers: list[dict[str, Any]],
        succeeded: list[int],
        failed: list[int],
        budget: int,
        res: Result,
    ) -> tuple[list[dict[str, Any]], str, bool, int]:
        """Create sealer Jobs for batches of whole finished groups (tracefleet.contract.semantics: every finished
        session is sealed, failed ones fail-closed); record sealed batches."""
        assigned: set[int] = set()
        seqs: list[int] = []
        recorded: list[dict[str, Any]] = []
        seal_failed = ""
        reads = 0
        for sj in sorted(sealers, key=lambda j: int((j["metadata"].get("labels") or {}).get(n.LABEL_BATCH, "0"))):
            ann = sj["metadata"].get("annotations") or {}
            seq = int((sj["metadata"].get("labels") or {}).get(n.LABEL_BATCH, "0"))
            seqs.append(seq)
            assigned.update(n.decode_ranges(ann.get(n.ANNOTATION_SESSIONS, "")))
            if ANNOTATION_BATCH in ann:
                recorded.append(json.loads(ann[ANNOTATION_BATCH]))
                continue
            if job_condition(sj, "Failed"):
                seal_failed = f"sealer Job {sj['metadata']['name']} failed"
                continue
            if job_condition(sj, "Complete") and reads < 5:
                reads += 1
                batch = self._read_batch(job, seq, {b["seq"] for b in recorded} | pending_seqs(sealers))
                if batch is None:
                    log.info("sealer Job %s completed but batch %d has no manifest yet", sj["metadata"]["name"], seq)
                    continue
                self.kube.annotate_job(job.namespace, sj["metadata"]["name"], {ANNOTATION_BATCH: json.dumps(batch, sort_keys=True)})
                recorded.append(batch)
                metrics.BATCHES_SEALED.inc()
                res.events.append((NORMAL, EVENT_BATCH_SEALED, f"batch {seq} sealed: {batch['traces']} traces at {batch['uri']}"))
                self._notify(job, batch, sj["metadata"]["name"])
        # new batches: whole groups whose sessions have all finished, in task order
        finished = set(succeeded) | set(failed)
        plan = session_plan(job.name, task_ids, job.samples_per_task)
        groups = [plan[t * job.samples_per_task : (t + 1) * job.samples_per_task] for t in range(len(task_ids))]
        ready = [t for t, g in enumerate(groups) if all(p.index in finished and p.index not in assigned for p in g)]
        unsealed = bool(finished - assigned) or len(recorded) < len(sealers)
        nxt = max(seqs) + 1 if seqs else 0
        per_batch = groups_per_batch(job.traces_per_batch, job.samples_per_task)
        for batch in next_batches(ready, per_batch, final=len(finished) == len(plan)):
            if budget <= 0:
                break
            if self.kube.create(sealer_job(job, self.cfg, nxt, [p for t in batch for p in groups[t]])):
                metrics.CHILDREN_CREATED.labels(n.COMPONENT_SEALER).inc()
            budget -= 1
            nxt += 1
        # webhook for recorded-but-undelivered batches (e.g. after an operator restart)
        for sj in sealers:
            ann = sj["metadata"].get("annotations") or {}
            if ANNOTATION_BATCH in ann and n.ANNOTATION_NOTIFIED not in ann:
                self._notify(job, json.loads(ann[ANNOTATION_BATCH]), sj["metadata"]["name"])
        recorded.sort(key=lambda b: b.get("seq", 0))
        return recorded, seal_failed, unsealed, budget

    def _read_batch(self, job: JobView, seq: int, skip: set[int]) -> dict[str, Any] | None:
        creds = self._secret(job.namespace, job.credentials_secret) if job.credentials_secret else None
        batch = bucketio.find_batch(job.bucket_uri, job.name, batch_id_for(seq), skip, creds, job.bucket_endpoint)
        if batch is None:
            return None
        batch["jobSeq"] = seq
        batch["sealedAt"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return batch

    def _notify(self, job: JobView, batch: dict[str, Any], sealer_name: str) -> None:
        if self.notifier is None or not job.webhook_url:
            return
        secret: bytes | None = None
        if job.webhook_secret:
            data = self._secret(job.namespace, job.webhook_secret[0]) or {}
            value = data.get(job.webhook_secret[1])
            secret = value.encode() if value else None
        payload = {
            "event": "batch.sealed",
            "job": {"namespace": job.namespace, "name": job.name, "uid": job.uid},
            "batch": batch,
        }
        ns, kube = job.namespace, self.kube

        def delivered() -> None:
            metrics.WEBHOOKS.labels("delivered").inc()
            kube.annotate_job(ns, sealer_name, {n.ANNOTATION_NOTIFIED: datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")})

        self.notifier.submit(
            Delivery(delivery_id=f"{job.uid}/{batch.get('batchId', batch.get('seq'))}", url=job.webhook_url, payload=payload, secret=secret, on_delivered=delivered)
        )

    def _resend_undelivered(self, job: JobView, res: Result) -> None:
        if self.notifier is None or not job.webhook_url:
            return
        for sj in self.kube.list_jobs(job.namespace, n.job_selector(job.name, n.COMPONENT_SEALER)):
            ann = sj["metadata"].get("annotations") or {}
            if ANNOTATION_BATCH in ann and n.ANNOTATION_NOTIFIED not in ann:
                self._notify(job, json.loads(ann[ANNOTATION_BATCH]), sj["metadata"]["name"])
