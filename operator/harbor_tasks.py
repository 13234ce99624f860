"""A Harbor job's tasks as the operator sees them (spec.tasks.harbor): read once per job per operator process from
the task source in the bucket, checked as `tracefleet validate` checks them, each with what its pods need: the
image, the resources, the instruction, the verifier's timeout and environment.

Sources on a cluster: an s3:// prefix holding task folders (or one), or a tarball in the bucket
(s3://BUCKET/PATH.tgz), read with the job's bucket credentials. A directory (or a tarball) on the operator's own
filesystem is refused in one line: the operator's machine is not where a job's inputs live, and the evaluator Jobs
must read the same tests again from the same place.

Images: task.toml's environment.docker_image as is, else the name `tracefleet tasks build --push REGISTRY` gave it
(tracefleet.runner.containers.images.task_image, REGISTRY = spec.tasks.harbor.registry, default localhost).
A folder with problems is left out, with one Warning Event per problem; a source with no runnable task at all fails
the job with InvalidSpec.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tracefleet.bucket import BucketError
from tracefleet.contract.harbor import TaskConfig
from tracefleet.contract.job import HarborTasks
from tracefleet.contract.plan import harbor_task
from tracefleet.contract.session import Task
from tracefleet.harbor.folders import HarborTask, check_tasks
from tracefleet.harbor.sources import TaskSourceError, open_source
from tracefleet.operator.bucketio import bucket_options
from tracefleet.harbor.image_names import LOCAL_REGISTRY, task_image

NOT_IN_BUCKET = ("spec.tasks.harbor.uri: {uri} is not in a bucket: on Kubernetes the task folders are read from an "
                 "s3:// prefix or a tarball there (s3://BUCKET/PATH.tgz), where the evaluator Jobs read their tests")


class HarborSourceError(ValueError):
    """The job's Harbor source cannot be used: one line (the job fails with InvalidSpec)."""


@dataclass(frozen=True)
class ClusterHarborTask:
    """One Harbor task as the cluster runs it: what its harness pod and evaluator Job need beside the session's plan
    (the image, the resources, task.toml)."""

    name: str
    image: str
    instruction: str
    config: TaskConfig

    @property
    def resources(self) -> dict[str, int | str]:
        return self.config.environment.resource_quantities()

    @property
    def workdir(self) -> str | None:
        return self.config.environment.workdir

    @property
    def verifier_timeout_s(self) -> int:
        """Whole seconds (the task image's `timeout` and the Job's deadline take them), rounded up."""
        return max(1, math.ceil(self.config.verifier.timeout_sec))

    def task(self, source: str) -> Task:
        """The session's task, made as `tracefleet run` makes it (tracefleet.contract.plan.harbor_task), its tests read
        again from the task `source` (spec.tasks.harbor.uri) by the evaluator Job's fetch step."""
        return harbor_task(self.name, self.instruction, self.config, source)


@dataclass
class HarborSource:
    tasks: list[ClusterHarborTask]
    problems: list[str] = field(default_factory=list)  # one line each, for Warning Events


def cluster_task(task: HarborTask, registry: str | None) -> ClusterHarborTask:
    return ClusterHarborTask(name=task.name, image=task_image(task, registry or LOCAL_REGISTRY),
                          instruction=task.instruction, config=task.config)


def read_source(harbor: HarborTasks, creds: dict[str, str] | None, endpoint: str | None) -> HarborSource:
    """The job's Harbor tasks; HarborSourceError when there is no runnable one or the source cannot be read."""
    if not harbor.uri.startswith("s3://"):
        raise HarborSourceError(NOT_IN_BUCKET.format(uri=harbor.uri))
    with tempfile.TemporaryDirectory(prefix="tracefleet-harbor-") as tmp:
        try:
            root = open_source(harbor.uri, Path(tmp) / "source", bucket_options=bucket_options(creds, endpoint))
        except (TaskSourceError, BucketError) as exc:
            raise HarborSourceError(f"spec.tasks.harbor.uri: {exc}") from None
        tasks, problems = check_tasks(root, harbor.uri, harbor.include)
        found = [cluster_task(t, harbor.registry) for t in tasks]
    if not found:
        raise HarborSourceError("spec.tasks.harbor: no runnable task: " + "; ".join(map(str, problems)))
    return HarborSource(found, [str(p) for p in problems])
