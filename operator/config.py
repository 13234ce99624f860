"""The operator's own settings (`tracefleet operator` flags): what no RolloutJob says."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_IMAGE = "ghcr.io/tracefleet/tracefleet:0.1.0"


@dataclass(frozen=True)
class OperatorConfig:
    proxy_image: str = DEFAULT_IMAGE  # the proxy sidecar's and the sealer Job's
    evaluator_image: str = DEFAULT_IMAGE  # when neither spec.evaluator.image nor spec.harness.image is set
    # Most child creations one reconcile may issue: bounds API calls per event at any scale.
    max_creates_per_reconcile: int = 100
    # Base of the exponential backoff before a failed session's next attempt.
    retry_backoff_s: float = 10.0
    retry_backoff_max_s: float = 600.0
    recent_batches: int = 5
    # S3 endpoint the pods reach the bucket at, when the credentials Secret names none (AWS_ENDPOINT_URL)
    bucket_endpoint: str | None = None
