"""Task image names: how an image is found again, by `tracefleet tasks build`, a local run and the operator alike.

    <registry>/tracefleet-task/<task name>:<digest>

where <registry> is `localhost` for a local build (podman's name for an image that lives only in its store) or
the registry given to `--push` (`spec.tasks.harbor.registry` on a cluster), <task name> is the folder's name made a
valid repository name, and <digest> is the first 16 hex digits of `environment_digest(folder)`: a sha256 over every
file's path, executable bit and content (symlinks by their target) in environment/. A task whose task.toml names
`docker_image` is not built: that image is used as is. An unchanged environment/ gives the same name, so the image
already in the store is the cache (no rebuild); any change to a file in it gives a new name. The base image a
Dockerfile starts FROM is not in the digest: rebuilding a base under the same tag does not rebuild the tasks on it.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from tracefleet.harbor.folders import HarborTask

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
