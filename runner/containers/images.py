"""Task images: each Harbor task's environment/ built into an image named by its content.

Naming (how an image is found again, by `tracefleet tasks build`, a local run and the operator alike):
    <registry>/tracefleet-task/<task name>:<digest>
where <registry> is `localhost` for a local build (podman's name for an image that lives only in its store) or
the registry given to `--push`, <task name> is the folder's name made a valid repository name, and <digest> is
the first 16 hex digits of `environment_digest(folder)`: a sha256 over every file's path, executable bit and
content (symlinks by their target) in environment/. A task whose task.toml names `docker_image` is not built:
that image is used as is. An unchanged environment/ gives the same name, so the image already in the store is
the cache (no rebuild); any change to a file in it gives a new name. The base image a Dockerfile starts FROM is
not in the digest: rebuilding a base under the same tag does not rebuild the tasks on it.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tracefleet.contract.harbor import DOCKERFILE
from tracefleet.harbor.folders import HarborTask

from tracefleet.runner.containers.runtime import ContainerError, ContainerRuntime, last_line

LOCAL_REGISTRY = "localhost"
IMAGE_REPOSITORY = "tracefleet-task"
DIGEST_CHARS = 16
_INVALID = re.compile(r"[^a-z0-9._-]+")


def environment_digest(environment: Path) -> str:
    """sha256 over environment/ (paths sorted; each file's relative path, executable bit and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in environment.rglob("*") if not p.is_dir() or p.is_symlink()):
        rel = path.relative_to(environment).as_posix()
        if path.is_symlink():
            kind, data = b"l", os.readlink(path).encode()
        else:
            kind, data = (b"x" if os.access(path, os.X_OK) else b"f"), path.read_bytes()
        for part in (rel.encode(), kind, str(len(data)).encode(), data):
            digest.update(part + b"\0")
    return digest.hexdigest()


def repository_name(task_name: str) -> str:
    """A task name as an image repository component: lower case, [a-z0-9._-], starting with a letter or digit."""
    name = _INVALID.sub("-", task_name.lower()).strip("._-")
    return name or "task"


def task_image(task: HarborTask, registry: str = LOCAL_REGISTRY) -> str:
    """The image a task runs in: the one task.toml names, else its environment's content-named build."""
    if task.prebuilt_image:
        return task.prebuilt_image
    tag = environment_digest(task.environment_dir)[:DIGEST_CHARS]
    return f"{registry.rstrip('/')}/{IMAGE_REPOSITORY}/{repository_name(task.name)}:{tag}"


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
