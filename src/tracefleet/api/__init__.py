"""The RolloutJob API model: the single source of truth for manifests, the CRD and validation.

    from tracefleet.api import RolloutJob
    job = RolloutJob.from_file("examples/local-command.yaml")
    job.spec.inference.is_managed, job.session_count(), job.to_manifest()
"""

from .model import (
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
    Task,
    Tasks,
    TaskWorkspace,
    Trainer,
    Webhook,
    Workspace,
)
from .validation import Problem, validate_file, validate_manifest, validate_text, validate_update

__all__ = [name for name in dir() if not name.startswith("_")]
