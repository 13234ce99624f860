"""What an agent changed in its (stopped) session container, read from the runtime's storage without copying the
container: its layer diff (`podman diff`) and its filesystem through `podman mount` (rootful podman: the merged
overlay on the host, read in place), with the image's own filesystem through `podman image mount` beside it.

Two things are made from one mount (tracefleet.runner.containers.place does both when it collects the session):
  - the change set the verifier applies (`write_change_set`: changes.tar and deleted.txt, the layout of
    tracefleet.contract.task_image, as a cluster's launcher makes it);
  - the session's patch: the working directory in the image against the same in the container
    (tracefleet.runner.workspace.tree_patch reads both mounts in place).
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from tracefleet.contract import task_image as ti

from tracefleet.runner.containers.runtime import ContainerRuntime

MOUNT_TIMEOUT_S = 120
# Never part of a change set: what the runtime makes or mounts in every container, and the verifier's own paths.
NOT_CHANGES = (*ti.NEVER_CHANGED, "/proc", "/sys", "/dev", "/run/.containerenv")


def mount_container(runtime: ContainerRuntime, container: str) -> Path:
    """The container's root filesystem, on the host, until `podman unmount` (or its removal)."""
    return Path(runtime.run("mount", container, timeout=MOUNT_TIMEOUT_S).stdout.strip())


@contextmanager
def mounted(runtime: ContainerRuntime, container: str) -> Iterator[Path]:
    """`mount_container` while in the block."""
    root = mount_container(runtime, container)
    try:
        yield root
    finally:
        runtime.run("unmount", container, check=False, timeout=MOUNT_TIMEOUT_S)


def mount_image(runtime: ContainerRuntime, image: str) -> Path:
    """The image's root filesystem, on the host, until `unmount_image` (mounts are counted: parallel sessions of one
    image each mount and unmount their own)."""
    return Path(runtime.run("image", "mount", image, timeout=MOUNT_TIMEOUT_S).stdout.strip())


def unmount_image(runtime: ContainerRuntime, image: str) -> None:
    runtime.run("image", "unmount", image, check=False, timeout=MOUNT_TIMEOUT_S)


def within(root: Path, path: str) -> Path | None:
    """`path` of the container's filesystem mounted at `root`, its links resolved inside `root` (an absolute link
    means the container's root, never the host's); None when it does not exist there."""
    here = PurePosixPath("/")
    parts = list(PurePosixPath(path).parts[1:])
    for _ in range(64 * (len(parts) + 1)):  # bounds a link loop
        if not parts:
            local = root / here.relative_to("/")
            return local if local.exists() else None
        part = parts.pop(0)
        if part == "..":
            here = here.parent
            continue
        local = root / (here / part).relative_to("/")
        if local.is_symlink():
            target = PurePosixPath(local.readlink())
            parts = [*target.parts[1:], *parts] if target.is_absolute() else [*target.parts, *parts]
            here = PurePosixPath("/") if target.is_absolute() else here
            continue
        here = here / part
    return None


def layer_diff(runtime: ContainerRuntime, container: str) -> dict[str, list[str]]:
    """{"changed", "added", "deleted"}: absolute paths, from `podman diff` of the container against its image."""
    diff = json.loads(runtime.run("diff", "--format", "json", container, timeout=MOUNT_TIMEOUT_S).stdout or "{}")
    return {key: list(diff.get(key) or []) for key in ("changed", "added", "deleted")}


def _skipped(path: str, skip: tuple[str, ...]) -> bool:
    return path in ("", "/") or any(path == p or path.startswith(p + "/") for p in (*NOT_CHANGES, *skip))


def _numeric(member: tarfile.TarInfo) -> tarfile.TarInfo:
    member.uname = member.gname = ""  # the container's owners by number: the host's names mean nothing there
    return member


def write_change_set(root: Path, diff: dict[str, list[str]], dest: Path, skip: tuple[str, ...] = ()) -> None:
    """dest/changes.tar (every path added or changed, read under `root`, names without their leading '/', owners
    by number, links as links) and dest/deleted.txt (one absolute path a line). `skip`: folders that are host
    mounts, not the container's (the session's HOME, the harness's tools)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / ti.DELETED).write_text("".join(f"{p}\n" for p in sorted(diff["deleted"]) if not _skipped(p, skip)))
    with tarfile.open(dest / ti.CHANGES, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted({*diff["changed"], *diff["added"]}):
            local = root / path.lstrip("/")  # podman diff names real paths: no link to resolve on the way
            if not _skipped(path, skip) and (local.exists() or local.is_symlink()):
                tar.add(local, arcname=path.lstrip("/"), recursive=False, filter=_numeric)


def change_set(runtime: ContainerRuntime, container: str, dest: Path, skip: tuple[str, ...] = ()) -> None:
    """`write_change_set` of a stopped container, on its own (the place makes it with the session's patch)."""
    diff = layer_diff(runtime, container)
    with mounted(runtime, container) as root:
        write_change_set(root, diff, dest, skip)
