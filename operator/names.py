"""Names shared by every child object: labels, annotations, the finalizer and child-name schemes.

Child names are deterministic (job name + session index + attempt), so a restarted operator that
re-runs a create gets 409 Conflict instead of a duplicate: idempotency comes from the API server,
not from memory.
"""

from __future__ import annotations

import hashlib

# The resource's names are the API model's (re-exported: children and handlers name them from here).
from tracefleet.contract.job import API_VERSION, GROUP, KIND, PLURAL, VERSION  # noqa: F401
from tracefleet.contract.semantics import decode_ranges, encode_ranges, session_index, task_and_sample  # noqa: F401 - the annotations use them

# Domain-named finalizer. The operator removes it as soon as the job is being deleted (children go
# with ownerReferences), so it can never hold a deletion hostage.
FINALIZER = "tracefleet.io/finalizer"

LABEL_JOB = "tracefleet.io/job"
LABEL_COMPONENT = "tracefleet.io/component"  # inference | harness | evaluator | sealer
LABEL_SESSION = "tracefleet.io/session"
LABEL_TASK = "tracefleet.io/task"
LABEL_SAMPLE = "tracefleet.io/sample"
LABEL_ATTEMPT = "tracefleet.io/attempt"
LABEL_BATCH = "tracefleet.io/batch"
LABEL_NETWORK = "tracefleet.io/network"  # "public" on a pod whose phase may reach the internet (network_policy)
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "tracefleet-operator"

ANNOTATION_SESSIONS = "tracefleet.io/sessions"  # on a sealer Job: the session indices it seals
ANNOTATION_NOTIFIED = "tracefleet.io/notified"  # on a sealer Job: the trainer webhook was delivered

# Labels copied from the RolloutJob to every pod so Kueue and priority classes see them.
PROPAGATED_LABEL_PREFIXES = ("kueue.x-k8s.io/",)
# The job's Kueue priority class: also every pod's priorityClassName.
LABEL_KUEUE_PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"

# The module the evaluator and sealer Jobs run (`python -m POD_PROGRAMS seal|evaluate`): named, never imported.
POD_PROGRAMS = "tracefleet.runner.pod"

COMPONENT_INFERENCE = "inference"
COMPONENT_HARNESS = "harness"
COMPONENT_EVALUATOR = "evaluator"
COMPONENT_SEALER = "sealer"

_MAX_NAME = 63


def _fit(name: str) -> str:
    """DNS-1123 label names are at most 63 characters: long names keep a hash of the full name."""
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: _MAX_NAME - 9]}-{digest}"


def inference_name(job: str) -> str:
    return _fit(f"{job}-inference")


def engine_key_secret_name(job: str) -> str:
    """The Secret holding the job's engine key (the operator makes it when spec.inference.managed names none)."""
    return _fit(f"{job}-engine-key")


ENGINE_KEY_SECRET_KEY = "api-key"  # the key inside that Secret


def network_policy_name(job: str) -> str:
    return _fit(f"{job}-harness")


def public_network_policy_name(job: str) -> str:
    return _fit(f"{job}-harness-public")


def evaluator_network_policy_name(job: str) -> str:
    return _fit(f"{job}-evaluator")


def sealer_network_policy_name(job: str) -> str:
    return _fit(f"{job}-sealer")


def harness_pod_name(job: str, session: int, attempt: int) -> str:
    return _fit(f"{job}-s{session}-a{attempt}")


def evaluator_job_name(job: str, session: int) -> str:
    return _fit(f"{job}-eval-s{session}")


def sealer_job_name(job: str, seq: int) -> str:
    return _fit(f"{job}-seal-{seq:06d}")


def plan_config_map_name(child: str, part: int) -> str:
    """The ConfigMap holding part `part` of a child's plan files (a child's name fits in 63 characters, this in
    a ConfigMap's 253)."""
    return f"{child}-plan-{part}"


def job_selector(job: str, component: str | None = None) -> str:
    parts = [f"{LABEL_JOB}={job}"]
    if component:
        parts.append(f"{LABEL_COMPONENT}={component}")
    return ",".join(parts)


# The session numbering is the job's meaning, not a naming scheme: one definition for both drivers.
session_of = session_index
task_sample_of = task_and_sample
