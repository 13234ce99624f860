"""The operator's own settings (`tracefleet operator` flags): what no RolloutJob says."""

from __future__ import annotations

from dataclasses import dataclass

from tracefleet.contract import images
from tracefleet.contract.dashboard import job_page_url
from tracefleet.contract.job import RolloutJob
from tracefleet.contract.plan import harness_config
from tracefleet.contract.session import HarnessConfig

DEFAULT_IMAGE = images.image_ref(images.DEFAULT_REGISTRY, images.TRACEFLEET, images.release_tag())
# spec.harness.image of a job that names none: the harness image `tracefleet images build` makes for its preset
# (the chart passes its registry and tag); a `command` harness runs in the tracefleet image itself.
DEFAULT_HARNESS_IMAGE = images.image_ref(images.DEFAULT_REGISTRY, images.harness_image_name(images.PRESET_PLACEHOLDER),
                                         images.release_tag())


@dataclass(frozen=True)
class OperatorConfig:
    proxy_image: str = DEFAULT_IMAGE  # the proxy sidecar's, the engine gate's and the sealer Job's
    evaluator_image: str = DEFAULT_IMAGE  # when neither spec.evaluator.image nor spec.harness.image is set
    # spec.harness.image when the job names none ({preset} is replaced); "" keeps spec.harness.image required
    harness_image: str = ""
    # Most child creations one reconcile may issue: bounds API calls per event at any scale (a child's plan ConfigMaps,
    # usually one, are created with it: children.plan_volume).
    max_creates_per_reconcile: int = 100
    # Base of the exponential backoff before a failed session's next attempt.
    retry_backoff_s: float = 10.0
    retry_backoff_max_s: float = 600.0
    recent_batches: int = 5
    # S3 endpoint the pods reach the bucket at, when the credentials Secret names none (AWS_ENDPOINT_URL)
    bucket_endpoint: str | None = None
    # Secrets every job's pods pull their images with (the chart's jobImagePullSecrets), before the job's own
    image_pull_secrets: tuple[str, ...] = ()
    # the chart's dashboard (`tracefleet dashboard`): its URL and the bucket folder it reads; "" when none runs
    dashboard_url: str = ""
    dashboard_uri: str = ""

    def dashboard_page(self, job: RolloutJob) -> str | None:
        """The job's page on the dashboard (status.dashboardUrl); None when none runs or it does not show the job."""
        return job_page_url(self.dashboard_url, self.dashboard_uri, job.spec.output.uri, job.name)

    def harness_image_of(self, harness: HarnessConfig) -> str | None:
        """The default image of a job's harness, as planned (None: no default configured)."""
        if not self.harness_image:
            return None
        return images.default_harness_image(harness.preset, self.harness_image, self.proxy_image)

    def with_default_images(self, job: RolloutJob) -> RolloutJob:
        """The job with spec.harness.image filled in from `harness_image` when it names none (the job's evaluator
        image defaults to it, as it does to a named one)."""
        harness = job.spec.harness
        image = harness.image or self.harness_image_of(harness_config(job))
        if image == harness.image:
            return job
        spec = job.spec.model_copy(update={"harness": harness.model_copy(update={"image": image})})
        return job.model_copy(update={"spec": spec})
