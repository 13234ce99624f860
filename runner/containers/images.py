"""Task images: each Harbor task's environment/ built into an image named by its content
(tracefleet.harbor.image_names says how images are named and found again), and pushed where a cluster pulls it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tracefleet.contract.harbor import DOCKERFILE
from tracefleet.harbor.folders import HarborTask
from tracefleet.harbor.image_names import task_image

from tracefleet.runner.containers.runtime import ContainerError, ContainerRuntime, last_line

BuildStatus = Literal["built", "cached", "prebuilt", "failed"]


@dataclass(frozen=True)
class ImageBuild:
    task: str
    image: str
    status: BuildStatus
    seconds: float
    error: str | None = None  # one line: the build's last error line
    pushed: str | None = None  # the name pushed to the registry

    def line(self) -> str:
        if self.status == "failed":
            return f"{self.task}: {self.error}"
        pushed = f", pushed {self.pushed}" if self.pushed else ""
        return f"{self.task}: {self.status} {self.image} ({self.seconds:.1f} s{pushed})"


def build_task_image(runtime: ContainerRuntime, task: HarborTask, log_dir: Path | None = None,
                     push: str | None = None) -> ImageBuild:
    """Build (or find) the task's image; with `push`, also tag it for that registry and push it there. Never
    raises for the task's own failure: a Dockerfile that does not build is a `failed` result with its last
    error line (the full log in `log_dir/<task>.build.log` when given), so the other tasks go on."""
    start = time.monotonic()
    image = task_image(task)
    status: BuildStatus = "prebuilt" if task.prebuilt_image else "cached"
    try:
        if not task.prebuilt_image and not runtime.image_exists(image):
            status = "built"
            _build(runtime, task, image, log_dir)
        pushed = _push(runtime, task, image, push) if push else None
    except ContainerError as err:
        return ImageBuild(task.name, image, "failed", time.monotonic() - start, str(err))
    return ImageBuild(task.name, image, status, time.monotonic() - start, pushed=pushed)


def _build(runtime: ContainerRuntime, task: HarborTask, image: str, log_dir: Path | None) -> None:
    timeout = task.config.environment.build_timeout_sec
    args = ("build", "-t", image, "-f", str(task.environment_dir / DOCKERFILE),
            str(task.environment_dir))
    try:
        proc = runtime.run(*args, timeout=timeout, check=False)
    except ContainerError as err:  # ran past build_timeout_sec
        raise ContainerError(f"image build ran past build_timeout_sec ({timeout:g} s)") from err
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"{task.name}.build.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise ContainerError(f"image build failed: {last_line(proc.stderr or proc.stdout)}")


def _push(runtime: ContainerRuntime, task: HarborTask, image: str, registry: str) -> str:
    if task.prebuilt_image:
        return image  # already in the registry it names
    remote = task_image(task, registry)
    runtime.run("tag", image, remote, timeout=60)
    runtime.run("push", remote, timeout=task.config.environment.build_timeout_sec)
    return remote
