"""One level-based reconcile of a RolloutJob: observe children, act a bounded amount, report.

Driven by a kopf timer (handlers.py), never by edge events: whatever happened while the operator
was down is simply observed on the next pass. Per pass: the harness pods from the namespace's watch
(harness_watch; one list when there is none), one Job list by label selector, one Deployment get
(managed inference), then at most `max_creates_per_reconcile`
creates/deletes and a few batch-manifest reads. State lives in the cluster (children and their
annotations) and the bucket; the in-memory caches below only save repeat calls. The policies are
modules of their own (immutable_spec, inference_ready, session_table, sealing, ttl_after_finished);
status.calculate_status turns what a pass observed into the job's status.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import kopf
from pydantic import ValidationError

from tracefleet.contract.job import Condition, Counters, RolloutJob, RolloutJobStatus
from tracefleet.contract.plan import TasksFileError
from tracefleet.contract.session import SessionPlan, Task
from tracefleet.contract.semantics import DiagnosticsCounts, OutcomeCounts
from tracefleet.contract.sealed_batch import BatchSealed, JobRef, SealedBatch
from tracefleet.contract.layout import batch_id_for
from tracefleet.contract.task_image import HARBOR_EVALUATOR
from tracefleet.operator import bucketio, metrics
from tracefleet.operator import names as n
from tracefleet.operator.body import job_of, plain, status_of
from tracefleet.operator.children.harness import exact_mode_problem, harness_pod
from tracefleet.operator.children.inference import (engine_key_secret, extra_args_problem, inference_deployment,
                                                   inference_service)
from tracefleet.operator.children.jobs import evaluator_job, sealer_job
from tracefleet.operator.children.metadata import namespace_of
from tracefleet.operator.children.network_policy import job_reach, network_policies
from tracefleet.operator.config import OperatorConfig
from tracefleet.operator.harbor_tasks import HarborSource, HarborSourceError, ClusterHarborTask, read_source
from tracefleet.operator.immutable_spec import check_spec
from tracefleet.operator.events import batch_key, event_manifest
from tracefleet.operator.harness_watch import HarnessWatch
from tracefleet.operator.inference_ready import CREATED, EndpointProbe, deployment_condition
from tracefleet.operator.kube import Kube
from tracefleet.operator.plans import job_plans, job_tasks
from tracefleet.operator.sealing import batches_to_seal, observe_sealers, record_annotation, recorded_batch
from tracefleet.operator.session_table import observe, plan
from tracefleet.operator.status import (
    EVENT_BATCH_SEALED,
    EVENT_DASHBOARD_URL,
    EVENT_TASK_LEFT_OUT,
    FINISHED_PHASES,
    NORMAL,
    REASON_INVALID_SPEC,
    Progress,
    calculate_status,
    condition_events,
    failed_status,
    quarantine_condition,
    status_changed,
    WARNING,
)
from tracefleet.operator.ttl_after_finished import ttl_expired
from tracefleet.operator.webhook import Delivery, WebhookNotifier

log = logging.getLogger(__name__)

# spec.managedBy of the jobs this operator runs (or none); others belong to another controller (e.g. MultiKueue)
MANAGED_BY_OPERATOR = "tracefleet.io/operator"


@dataclass
class Result:
    status: RolloutJobStatus | None = None  # None: unchanged, skip the write
    annotations: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    delete: bool = False
    api_calls: int = 0


def _task_of(harbor: HarborSource | None, job: RolloutJob, session: int) -> ClusterHarborTask | None:
    """The Harbor task a session runs (None for a job without Harbor tasks)."""
    return None if harbor is None else harbor.tasks[n.task_sample_of(session, job.spec.tasks.samples_per_task)[0]]


def _utc_seconds(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Reconciler:
    kube: Kube
    cfg: OperatorConfig = field(default_factory=OperatorConfig)
    notifier: WebhookNotifier | None = None
    _ensured: dict[str, set[str]] = field(default_factory=dict)
    _tasks: dict[str, list[Task]] = field(default_factory=dict)
    _plans: dict[str, tuple[int, list[SessionPlan]]] = field(default_factory=dict)  # by job: (generation, plans)
    _harbor: dict[str, HarborSource] = field(default_factory=dict)
    _made_calls: dict[tuple[str, int, int], bool] = field(default_factory=dict)
    _secrets: dict[tuple[str, str], dict[str, str] | None] = field(default_factory=dict)
    _endpoints: EndpointProbe = field(default_factory=EndpointProbe)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # guards _harbor_reads
    _harbor_reads: dict[str, threading.Lock] = field(default_factory=dict)  # one per job: a read blocks no other job
    harness: HarnessWatch | None = None  # the harness pods by watch; None: listed on every pass

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

    def post_event(self, ns: str, job: str, uid: str, type_: str, reason: str, message: str, key: str) -> None:
        """An Event about the job, once per `key` (tracefleet.operator.events)."""
        self.kube.create_object(event_manifest(ns, job, uid, type_, reason, message, key))

    def forget(self, uid: str) -> None:
        self._ensured.pop(uid, None)
        self._tasks.pop(uid, None)
        self._plans.pop(uid, None)
        self._harbor.pop(uid, None)
        self._harbor_reads.pop(uid, None)
        for key in [k for k in self._made_calls if k[0] == uid]:
            del self._made_calls[key]

    # ------------------------------------------------------------------ the pass

    def _reconcile(self, body: Any, now: datetime) -> Result:
        res = Result()
        meta = body["metadata"]
        old = status_of(body)
        try:
            job = self.cfg.with_default_images(job_of(body))
        except ValidationError as e:  # the CRD should have refused it; report instead of crash-looping
            res.status = self._fail_status(old, int(meta.get("generation") or 0), REASON_INVALID_SPEC, str(e)[:1000], now)
            return res
        spec = job.spec
        if spec.managed_by and spec.managed_by != MANAGED_BY_OPERATOR:
            return res  # another controller (e.g. MultiKueue) owns it

        # Immutable fields: remember what the job started with; refuse later changes by condition.
        checked = check_spec(plain(body["spec"]), job.metadata.annotations)
        res.annotations.update(checked.record)

        if old.phase in FINISHED_PHASES:
            return self._after_finish(job, old, now, res)

        problems: list[str] = []
        if not spec.harness.image:
            problems.append("spec.harness.image is required on Kubernetes (or the operator's --harness-image: the "
                            "chart's operator.defaultHarnessImages)")
        if spec.evaluator is not None and not spec.evaluator_image():
            problems.append("spec.evaluator.image (or spec.harness.image) is required on Kubernetes")
        for problem in (exact_mode_problem(job), extra_args_problem(job)):
            if problem is not None:
                problems.append(problem)
        harbor: HarborSource | None = None
        if spec.tasks.harbor is not None:
            if spec.evaluator is not None and spec.evaluator.preset not in (None, HARBOR_EVALUATOR):
                problems.append(f"spec.evaluator.preset {spec.evaluator.preset}: Harbor tasks are judged by their own "
                                f"tests/test.sh (preset {HARBOR_EVALUATOR}, or no spec.evaluator)")
            else:
                try:
                    harbor = self._harbor_source(job, res)
                except HarborSourceError as exc:
                    problems.append(str(exc))
        if problems:
            res.status = self._fail_status(old, job.metadata.generation or 0, REASON_INVALID_SPEC, "; ".join(problems), now)
            return res

        ns = namespace_of(job)
        plans = self._plans_of(job, harbor)
        task_ids = [t.id for t in self._tasks_of(job, harbor)]
        total = len(plans)
        budget = self.cfg.max_creates_per_reconcile

        # --- inference
        inference, budget = self._inference(job, budget)

        # --- observe sessions
        pods, succeeded = self._harness_pods(ns, job.name)
        jobs = self.kube.list_jobs(ns, n.job_selector(job.name))
        evals = [j for j in jobs if (j["metadata"].get("labels") or {}).get(n.LABEL_COMPONENT) == n.COMPONENT_EVALUATOR]
        sealers = [j for j in jobs if (j["metadata"].get("labels") or {}).get(n.LABEL_COMPONENT) == n.COMPONENT_SEALER]
        table = observe(total, pods, evals, succeeded)
        may_start = inference.status == "True" and not spec.suspend and not checked.refused
        p = plan(
            table,
            has_evaluator=spec.evaluator is not None or harbor is not None,
            parallelism=spec.parallelism,
            max_retries=spec.max_retries,
            now=now.timestamp(),
            backoff_base_s=self.cfg.retry_backoff_s,
            backoff_cap_s=self.cfg.retry_backoff_max_s,
            may_start=may_start,
            made_calls=lambda s: self._session_made_calls(job, s, table.failures.get(s, 0)),
        )

        # --- suspend: running sessions go away (Kueue preemption semantics); they rerun on resume
        if spec.suspend:
            for plist in table.alive.values():
                for pod in plist:
                    if budget <= 0:
                        break
                    self.kube.delete_pod(ns, pod["metadata"]["name"])
                    budget -= 1

        # --- network policies once per job (per operator process)
        ensured = self._ensured.setdefault(self._uid(job), set())  # one reference (see _after_finish)
        if "netpol" not in ensured and budget > 0:
            reach = job_reach(job, self.cfg, self._bucket_creds(job), self.kube.get_service)
            for policy in network_policies(job, reach, harbor):
                self.kube.create(policy)
                budget -= 1
            ensured.add("netpol")

        # --- harness pods and evaluator Jobs
        batch_pods = [harness_pod(job, self.cfg, plans[s], a, harbor=_task_of(harbor, job, s)) for s, a in p.need_pod[: max(0, budget)]]
        budget -= len(batch_pods)
        created_pods = self._create_harness_pods(batch_pods)
        metrics.CHILDREN_CREATED.labels(n.COMPONENT_HARNESS).inc(created_pods)
        if spec.evaluator is not None or harbor is not None:
            evals_new = [evaluator_job(job, self.cfg, plans[s], harbor=_task_of(harbor, job, s)) for s in p.need_eval[: max(0, budget)]]
            budget -= len(evals_new)
            metrics.CHILDREN_CREATED.labels(n.COMPONENT_EVALUATOR).inc(sum(self.kube.create_many(evals_new)))

        # --- sealing: fixed session sets per batch, recorded on the sealer Job itself
        batches, seal_failed, unsealed, budget = self._batches(job, task_ids, plans, sealers, set(p.succeeded) | set(p.failed), budget,
                                                             res)

        # --- counters, phase, conditions
        # what the diagnostics made of the sealed sessions, from the recorded manifests (as `tracefleet run` counts)
        diagnosed = sum((DiagnosticsCounts.from_json(b.diagnostics) for b in batches), DiagnosticsCounts())
        outcomes = sum((OutcomeCounts.from_json(b.outcomes) for b in batches), OutcomeCounts())
        counts = Counters(
            total=total,
            running=p.running + created_pods,
            succeeded=len(p.succeeded),
            failed=len(p.failed),
            traces=sum(b.traces for b in batches),
            tokens=sum(b.tokens for b in batches),
            judged=diagnosed.judged,
            quarantined=diagnosed.quarantined,
            dropped=diagnosed.dropped,
            infrastructure=outcomes.infrastructure,
        )
        counts.pending = max(0, total - counts.running - counts.succeeded - counts.failed)
        policy = spec.diagnostics_policy
        new = calculate_status(Progress(
            generation=job.metadata.generation or 0,
            counts=counts,
            inference=inference,
            batches=batches,
            spec_rejected=checked.refused,
            seal_failed=seal_failed,
            unsealed=unsealed,
            suspended=spec.suspend,
            terminating=table.terminating,
            quarantine=quarantine_condition(diagnosed, policy.max_quarantine_rate, policy.min_judged_sessions),
        ), old, now, self.cfg.recent_batches)
        new.dashboard_url = self.cfg.dashboard_page(job)
        if new.dashboard_url and new.dashboard_url != old.dashboard_url:  # once: the next pass reads it in status
            res.events.append((NORMAL, EVENT_DASHBOARD_URL, f"the job's dashboard: {new.dashboard_url}"))
        res.events += condition_events(old.conditions, new.conditions or [])
        if status_changed(old, new):
            res.status = new
        metrics.record_job(ns, job.name, new.phase or "", counts, diagnosed)
        return res

    # ------------------------------------------------------------------ pieces

    def _harness_pods(self, ns: str, job: str) -> tuple[list[dict[str, Any]], list[int]]:
        """(live and failed harness pods, succeeded sessions): from the namespace's pod watch when there is
        one (tracefleet.operator.harness_watch), else one list."""
        if self.harness is None:
            return self.kube.list_pods(ns, n.job_selector(job, n.COMPONENT_HARNESS)), []
        view = self.harness.view(ns, job)
        return view.pods, view.succeeded

    def _create_harness_pods(self, manifests: list[dict[str, Any]]) -> int:
        created = [p for p in self.kube.create_all(manifests) if p is not None]
        if self.harness is not None:
            for pod in created:
                self.harness.created(pod)
        return len(created)

    def _fail_status(self, old: RolloutJobStatus, generation: int, reason: str, message: str,
                     now: datetime) -> RolloutJobStatus | None:
        return failed_status(old, generation, reason, message, self.cfg.recent_batches, now)

    @staticmethod
    def _uid(job: RolloutJob) -> str:
        return job.metadata.uid or ""

    def _after_finish(self, job: RolloutJob, old: RolloutJobStatus, now: datetime, res: Result) -> Result:
        """Finished jobs: nothing runs; scale inference to zero, then honour ttlSecondsAfterFinished."""
        # one reference to the set: the deletion handler (another thread) may drop the job's entry meanwhile
        ensured = self._ensured.setdefault(self._uid(job), set())
        ns = namespace_of(job)
        if job.spec.inference.managed is not None and "scaled-down" not in ensured:
            dep = self.kube.get_deployment(ns, n.inference_name(job.name))
            if dep and (dep.get("spec") or {}).get("replicas", 0) != 0:
                self.kube.scale_deployment(ns, n.inference_name(job.name), 0)
            ensured.add("scaled-down")
        res.delete = ttl_expired(job, old, now)
        self._resend_undelivered(job)
        return res

    def _bucket_creds(self, job: RolloutJob) -> dict[str, str] | None:
        ref = job.spec.output.credentials_secret_ref
        return self._secret(namespace_of(job), ref.name) if ref else None

    def _harbor_source(self, job: RolloutJob, res: Result) -> HarborSource:
        """The job's Harbor tasks, read from the bucket once per operator process (a Warning Event per folder
        left out, on that read); HarborSourceError when none can run."""
        key = self._uid(job)
        with self._lock:
            read = self._harbor_reads.setdefault(key, threading.Lock())
        with read:  # the bucket read holds only this job's lock: other jobs' passes go on meanwhile
            if key not in self._harbor:
                assert job.spec.tasks.harbor is not None
                source = read_source(job.spec.tasks.harbor, self._bucket_creds(job), self.cfg.bucket_endpoint)
                res.events += [(WARNING, EVENT_TASK_LEFT_OUT, problem) for problem in source.problems]
                self._harbor[key] = source
            return self._harbor[key]

    def _tasks_of(self, job: RolloutJob, harbor: HarborSource | None) -> list[Task]:
        """The job's tasks, in order (tasks from a ConfigMap, a URI or Harbor folders are read once per operator
        process), as the planner takes them (tracefleet.operator.plans)."""
        tasks = job.spec.tasks
        if tasks.inline is not None:
            return job_tasks(job)
        key = self._uid(job)
        if key not in self._tasks:
            text: str | None = None
            if tasks.config_map_ref:
                cm = self.kube.get_configmap(namespace_of(job), tasks.config_map_ref.name)
                text = ((cm or {}).get("data") or {}).get(tasks.config_map_ref.key)
            elif tasks.uri:
                text = bucketio.read_text(tasks.uri, self._bucket_creds(job))
            if text is None and harbor is None:
                # the ConfigMap or the object may be created after the job: look again later
                raise kopf.TemporaryError(f"tasks of {namespace_of(job)}/{job.name} not found", delay=30)
            try:
                self._tasks[key] = job_tasks(job, text, harbor)
            except TasksFileError as exc:  # it may be fixed in place: look again later
                raise kopf.TemporaryError(str(exc), delay=30) from None
        return self._tasks[key]

    def _plans_of(self, job: RolloutJob, harbor: HarborSource | None) -> list[SessionPlan]:
        """Every session's plan, by index: planned once per generation of the job (a policy update changes them)."""
        key, generation = self._uid(job), job.metadata.generation or 0
        cached = self._plans.get(key)
        if cached is None or cached[0] != generation:
            cached = self._plans[key] = (generation, job_plans(job, self._tasks_of(job, harbor)))
        return cached[1]

    def _session_made_calls(self, job: RolloutJob, session: int, failures: int) -> bool:
        """Whether the session's latest failed attempt made a model call (its uploaded capture log is not
        empty): then the failure is data and is not retried. Read once per failure."""
        key = (self._uid(job), session, failures)
        if key not in self._made_calls:
            self._made_calls[key] = bucketio.session_made_calls(job.spec.output.uri, job.name, session, self._bucket_creds(job),
                                                                self.cfg.bucket_endpoint)
        return self._made_calls[key]

    def _secret(self, ns: str, name: str) -> dict[str, str] | None:
        key = (ns, name)
        if key not in self._secrets or self._secrets[key] is None:
            self._secrets[key] = self.kube.get_secret_data(ns, name)
        return self._secrets[key]

    def _inference(self, job: RolloutJob, budget: int) -> tuple[Condition, int]:
        """InferenceReady (inference_ready), creating and scaling the managed engine's children on the way."""
        inf = job.spec.inference
        if inf.managed is None:
            return self._endpoints.condition(inf.external.base_url if inf.external else ""), budget
        ensured = self._ensured.setdefault(self._uid(job), set())
        ns, name = namespace_of(job), n.inference_name(job.name)
        if "engine-key" not in ensured:  # before any pod that reads it
            if (secret := engine_key_secret(job)) is not None:
                self.kube.create(secret)  # already there (an earlier pass, another replica): kept as it is
                budget -= 1
            ensured.add("engine-key")
        if "service" not in ensured:
            self.kube.create(inference_service(job))
            ensured.add("service")
            budget -= 1
        dep = self.kube.get_deployment(ns, name)
        if dep is None:
            self.kube.create(inference_deployment(job, self.cfg))
            metrics.CHILDREN_CREATED.labels(n.COMPONENT_INFERENCE).inc()
            return CREATED, budget - 1
        want = 0 if job.spec.suspend else inf.managed.replicas
        if (dep.get("spec") or {}).get("replicas") != want:
            self.kube.scale_deployment(ns, name, want)
            budget -= 1
        return deployment_condition(dep, want, job.spec.suspend), budget

    def _batches(self, job: RolloutJob, task_ids: list[str], plans: list[SessionPlan], sealers: list[dict[str, Any]],
                 finished: set[int],
                 budget: int, res: Result) -> tuple[list[SealedBatch], str, bool, int]:
        """Record the batches of sealer Jobs that completed, create sealer Jobs for new batches (sealing);
        (recorded batches by seq, which sealer failed, whether a finished session is not recorded yet, budget)."""
        seen = observe_sealers(sealers)
        recorded = list(seen.recorded)
        for seq, sealer_name in seen.completed:
            batch = self._read_batch(job, seq, {b.seq for b in recorded})
            if batch is None:
                log.info("sealer Job %s completed but batch %d has no manifest yet", sealer_name, seq)
                continue
            # the Event before the annotation that records the batch: a replica taking over after a kill in
            # between posts the same Event again, under the same name (tracefleet.operator.events)
            self.post_event(namespace_of(job), job.name, self._uid(job), NORMAL, EVENT_BATCH_SEALED,
                            f"batch {seq} sealed: {batch.traces} traces at {batch.uri}", batch_key(self._uid(job), seq))
            self.kube.annotate_job(namespace_of(job), sealer_name, record_annotation(batch))
            recorded.append(batch)
            metrics.BATCHES_SEALED.inc()
            self._notify(job, batch, sealer_name)
        unsealed = bool(finished - seen.assigned) or len(recorded) < seen.count
        nxt = seen.next_seq
        for sessions in batches_to_seal(job, task_ids, finished, seen.assigned):
            if budget <= 0:
                break
            if self.kube.create(sealer_job(job, self.cfg, nxt, [plans[s.index] for s in sessions])):
                metrics.CHILDREN_CREATED.labels(n.COMPONENT_SEALER).inc()
            budget -= 1
            nxt += 1
        self._notify_undelivered(job, sealers)  # recorded but not delivered (e.g. after an operator restart)
        recorded.sort(key=lambda b: b.seq)
        return recorded, seen.failed, unsealed, budget

    def _read_batch(self, job: RolloutJob, seq: int, skip: set[int]) -> SealedBatch | None:
        batch = bucketio.find_batch(job.spec.output.uri, job.name, batch_id_for(seq), skip, self._bucket_creds(job),
                                    self.cfg.bucket_endpoint)
        if batch is None:
            return None
        return batch.model_copy(update={"job_seq": seq, "sealed_at": _utc_seconds(datetime.now(timezone.utc))})

    def _notify(self, job: RolloutJob, batch: SealedBatch, sealer_name: str) -> None:
        hook = job.spec.trainer.webhook if job.spec.trainer else None
        if self.notifier is None or hook is None:
            return
        ns, kube = namespace_of(job), self.kube
        secret: bytes | None = None
        if hook.secret_ref:
            value = (self._secret(ns, hook.secret_ref.name) or {}).get(hook.secret_ref.key)
            secret = value.encode() if value else None
        payload = BatchSealed(job=JobRef(namespace=ns, name=job.name, uid=self._uid(job)), batch=batch).to_wire()

        def delivered() -> None:
            metrics.WEBHOOKS.labels("delivered").inc()
            kube.annotate_job(ns, sealer_name, {n.ANNOTATION_NOTIFIED: _utc_seconds(datetime.now(timezone.utc))})

        self.notifier.submit(Delivery(delivery_id=f"{self._uid(job)}/{batch.batch_id or batch.seq}", url=hook.url,
                                      payload=payload, secret=secret, on_delivered=delivered))

    def _notify_undelivered(self, job: RolloutJob, sealers: list[dict[str, Any]]) -> None:
        for sj in sealers:
            if (batch := recorded_batch(sj)) is not None and n.ANNOTATION_NOTIFIED not in (sj["metadata"].get("annotations") or {}):
                self._notify(job, batch, sj["metadata"]["name"])

    def _resend_undelivered(self, job: RolloutJob) -> None:
        if self.notifier is None or not (job.spec.trainer and job.spec.trainer.webhook):
            return
        self._notify_undelivered(job, self.kube.list_jobs(namespace_of(job), n.job_selector(job.name, n.COMPONENT_SEALER)))
