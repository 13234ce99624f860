"""The RolloutJob's public API: the model (defined once, on the contract floor: tracefleet.contract.job), its
YAML manifests, the CRD generated from it and validation.

    from tracefleet.api import load_job
    job = load_job("examples/local-command.yaml")
    job.spec.inference.is_managed, job.session_count(), job.to_manifest()
"""

from tracefleet.contract.job import (
    API_VERSION,
    CATEGORIES,
    CRD_NAME,
    DEFAULT_VLLM_IMAGE,
    EVALUATOR_PRESETS,
    GROUP,
    HARNESS_PRESETS,
    KIND,
    PLURAL,
    RECENT_BATCHES_MAX,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    BatchRef,
    Capture,
    Condition,
    ConfigMapTasks,
    Counters,
    Evaluator,
    ExternalInference,
    Harness,
    Inference,
    ManagedInference,
    ModelCache,
    ObjectMeta,
    Output,
    ResourceRequirements,
    RolloutJob,
    RolloutJobSpec,
    RolloutJobStatus,
    SecretKeyRef,
    SecretRef,
    TaskSpec,
    Tasks,
    TaskWorkspace,
    Trainer,
    Webhook,
    Workspace,
)
from tracefleet.api.manifest import job_from_yaml, job_to_yaml, load_job
from tracefleet.api.validation import Problem, validate_file, validate_manifest, validate_text, validate_update

__all__ = [name for name in dir() if not name.startswith("_")]
