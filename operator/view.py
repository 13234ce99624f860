"""What the operator needs of a RolloutJob, read once from the `tracefleet.api` model.

`JobView.from_body` validates the object's body with the shared pydantic model (the single source
of truth) and flattens the handful of fields the child builders use, so the builders stay small
and the mapping from model to children lives in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracefleet.contract.job import DiagnosticsPolicy, Inference, RolloutJob


@dataclass(frozen=True)
class OperatorConfig:
    proxy_image: str = "ghcr.io/tracefleet/tracefleet:0.1.0"
    evaluator_image: str = "ghcr.io/tracefleet/tracefleet:0.1.0"
    # Most child creations one reconcile may issue: bounds API calls per event at any scale.
    max_creates_per_reconcile: int = 100
    # Base of the exponential backoff before a failed session's next attempt.
    retry_backoff_s: float = 10.0
    retry_backoff_max_s: float = 600.0
    recent_batches: int = 5


@dataclass(frozen=True)
class ManagedView:
    image: str
    model: str
    served_model_name: str
    tensor_parallel_size: int = 1
    gpus: int = 1
    replicas: int = 1
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    cache_claim: str | None = None
    cache_path: str | None = None
    shm_size: str | None = None
    startup_timeout_s: int = 900


@dataclass(frozen=True)
class HarnessView:
    image: str
    preset: str | None = None
    command: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    runtime_class: str | None = None
    timeout_s: int = 1800
    workspace_setup: tuple[str, ...] = ()  # spec.harness.workspace.setup, run before the harness starts


@dataclass(frozen=True)
class EvaluatorView:
    image: str | None = None
    preset: str | None = None
    command: tuple[str, ...] = ()
    timeout_s: int = 600
    entry_point: str | None = None  # preset hook: module:function


@dataclass(frozen=True)
class JobView:
    name: str
    namespace: str
    uid: str
    generation: int
    labels: dict[str, str]
    managed: ManagedView | None
    external_url: str | None
    served_model: str
    capture_mode: str  # auto | exact | server
    policy_version: int
    harness: HarnessView
    evaluator: EvaluatorView | None
    tasks_inline: list[dict[str, Any]] | None
    tasks_configmap: tuple[str, str] | None  # (name, key)
    tasks_uri: str | None
    tasks_harbor: str | None  # Harbor task folders' uri (not run on Kubernetes yet: refused by reconcile)
    samples_per_task: int
    bucket_uri: str
    bucket_endpoint: str | None
    credentials_secret: str | None
    traces_per_batch: int
    builder: str
    webhook_url: str | None
    webhook_secret: tuple[str, str] | None  # (secret name, key)
    parallelism: int
    max_retries: int
    suspend: bool
    ttl_after_finished_s: int | None
    priority_class: str | None = None
    managed_by: str | None = None
    # exact mode in the proxy sidecar: where it reads the tokenizer (--model-path), the family/parser
    # overrides, and the volume (claim, mount path) holding it, mounted read-only
    capture_tokenizer: str | None = None
    capture_family: str | None = None
    capture_tool_parser: str | None = None
    tokenizer_cache: tuple[str, str] | None = None
    # spec.inference as given: vLLM's command line is built from it (tracefleet.vllm.vllm_server)
    inference: Inference | None = None
    # (Secret name, key) of the engine's API key: the managed vLLM's or the external engine's
    engine_api_key: tuple[str, str] | None = None
    # spec.diagnostics in its wire form (None: the job lists none); the sealer Job runs them
    diagnostics: tuple[dict[str, Any], ...] | None = None
    # spec.diagnosticsPolicy: when the job's quarantine rate is a condition (tracefleet.contract.semantics)
    diagnostics_policy: DiagnosticsPolicy = field(default_factory=DiagnosticsPolicy)

    @property
    def inline_task_count(self) -> int | None:
        return None if self.tasks_inline is None else len(self.tasks_inline)

    @classmethod
    def from_body(cls, body: Any, bucket_endpoint: str | None = None) -> "JobView":
        """Validate a RolloutJob body (as the API server returns it) with the shared model."""
        rj = RolloutJob.model_validate(_plain(body))
        return cls.from_model(rj, bucket_endpoint=bucket_endpoint)

    @classmethod
    def from_model(cls, rj: RolloutJob, bucket_endpoint: str | None = None) -> "JobView":
        s = rj.spec
        meta = rj.metadata
        inf = s.inference
        managed = None
        if inf.managed is not None:
            m = inf.managed
            res = m.resources.model_dump(mode="json", exclude_none=True) if m.resources else {}
            managed = ManagedView(
                image=m.image,
                model=m.model,
                served_model_name=m.served_name(),
                tensor_parallel_size=m.tensor_parallel_size,
                gpus=m.gpus(),
                replicas=m.replicas,
                extra_args=tuple(m.extra_args or ()),
                resources=res,
                # vLLM downloads into $HF_HOME/hub: the claim is that cache, wherever it is mounted
                env={"HF_HOME": m.model_cache.mount_path} if m.model_cache else {},
                cache_claim=m.model_cache.claim_name if m.model_cache else None,
                cache_path=m.model_cache.mount_path if m.model_cache else None,
            )
        served = managed.served_model_name if managed else (inf.external.model if inf.external and inf.external.model else "")
        h = s.harness
        harness = HarnessView(
            image=h.image or "",
            preset=h.preset,
            command=tuple(h.command or ()),
            env=dict(h.env or {}),
            resources=h.resources.model_dump(mode="json", exclude_none=True) if h.resources else {},
            runtime_class=h.runtime_class_name,
            timeout_s=h.session_timeout_seconds,
            workspace_setup=tuple(h.workspace.setup or ()),
        )
        e = s.evaluator
        evaluator = (
            EvaluatorView(image=e.image or h.image, preset=e.preset, command=tuple(e.command or ()), timeout_s=e.timeout_seconds,
                          entry_point=e.entry_point)
            if e is not None
            else None
        )
        cap = inf.capture
        cache = cap.tokenizer_cache or (inf.managed.model_cache if inf.managed else None)
        t = s.tasks
        hook = s.trainer.webhook if s.trainer and s.trainer.webhook else None
        return cls(
            name=meta.name,
            namespace=meta.namespace or "default",
            uid=meta.uid or "",
            generation=meta.generation or 0,
            labels=dict(meta.labels or {}),
            managed=managed,
            external_url=inf.external.base_url if inf.external else None,
            served_model=served,
            capture_mode=inf.capture.mode,
            policy_version=inf.policy_version,
            diagnostics=None if s.diagnostics is None else tuple(
                d.model_dump(mode="json", by_alias=True, exclude_none=True) for d in s.diagnostics),
            diagnostics_policy=s.diagnostics_policy,
            harness=harness,
            evaluator=evaluator,
            tasks_inline=[x.model_dump(mode="json", by_alias=True, exclude_none=True) for x in t.inline] if t.inline is not None else None,
            tasks_configmap=(t.config_map_ref.name, t.config_map_ref.key) if t.config_map_ref else None,
            tasks_uri=t.uri,
            tasks_harbor=t.harbor.uri if t.harbor else None,
            samples_per_task=t.samples_per_task,
            bucket_uri=s.output.uri,
            bucket_endpoint=bucket_endpoint,
            credentials_secret=s.output.credentials_secret_ref.name if s.output.credentials_secret_ref else None,
            traces_per_batch=s.output.traces_per_batch,
            builder=s.output.builder,
            webhook_url=hook.url if hook else None,
            webhook_secret=(hook.secret_ref.name, hook.secret_ref.key) if hook and hook.secret_ref else None,
            parallelism=s.parallelism,
            max_retries=s.max_retries,
            suspend=s.suspend,
            ttl_after_finished_s=s.ttl_seconds_after_finished,
            priority_class=(meta.labels or {}).get("kueue.x-k8s.io/priority-class"),
            managed_by=s.managed_by,
            capture_tokenizer=cap.tokenizer or (managed.model if managed else served or None),
            capture_family=cap.model_family,
            capture_tool_parser=cap.tool_parser,
            tokenizer_cache=(cache.claim_name, cache.mount_path) if cache else None,
            inference=inf,
            engine_api_key=(key.name, key.key) if (key := (inf.managed or inf.external).api_key_secret_ref) else None,
        )


def _plain(body: Any) -> dict[str, Any]:
    """kopf bodies are mapping views; the model wants plain dicts, and status is ours to rebuild."""
    d = {k: (dict(v) if hasattr(v, "keys") else v) for k, v in dict(body).items()}
    d.pop("status", None)
    meta = dict(d.get("metadata") or {})
    d["metadata"] = {k: meta[k] for k in ("name", "namespace", "labels", "annotations", "generation", "uid") if k in meta}
    return __import__("json").loads(__import__("json").dumps(d, default=str))
