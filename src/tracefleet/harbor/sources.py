"""Where a job's Harbor task folders come from (`spec.tasks.harbor.uri`): a directory, a tarball of task
folders (.tar, .tar.gz, .tgz), or an s3:// prefix holding task folders (or one tarball). Each is made a local
directory of task folders; folders.task_folders then finds the tasks in it."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

from tracefleet.tarballs import extract_all

TARBALL_SUFFIXES = (".tar", ".tar.gz", ".tgz")


class TaskSourceError(ValueError):
    """A task source that cannot be opened: one line naming it."""


def is_tarball(name: str) -> bool:
    return name.endswith(TARBALL_SUFFIXES)


def _unpack(tarball: Path, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(tarball) as archive:
            # "data": no absolute paths, no `..`, no links out of the folder, no device files.
            extract_all(archive, into)
    except (tarfile.TarError, OSError) as err:
        raise TaskSourceError(f"{tarball}: cannot unpack: {err}") from err
    # `tar czf tb2.tgz tb2/` wraps the task folders in one folder: the source is that folder.
    entries = list(into.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else into


def _download(uri: str, into: Path, options: dict[str, Any]) -> Path:
    from tracefleet.bucket import BucketError, open_bucket

    bucket_uri, _, name = uri.rstrip("/").rpartition("/") if is_tarball(uri) else (uri, "", "")
    try:
        bucket = open_bucket(bucket_uri, **options)
        if name:
            tarball = into.with_suffix(".download")
            tarball.write_bytes(bucket.get(name))
            return _unpack(tarball, into)
        count = 0
        for obj in bucket.list(""):
            target = (into / obj.key).resolve()
            if not target.is_relative_to(into.resolve()):
                raise TaskSourceError(f"{uri}: object {obj.key!r} leaves the task folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(bucket.get(obj.key))
            count += 1
    except BucketError as err:
        raise TaskSourceError(f"{uri}: {err}") from err
    if not count:
        raise TaskSourceError(f"{uri}: no objects under this prefix")
    return into


def open_source(uri: str, workdir: Path, base_dir: Path | None = None, bucket_options: dict[str, Any] | None = None) -> Path:
    """A local directory holding the source's task folders. A directory is used in place; a tarball or an s3://
    source is unpacked or downloaded into `workdir` (which the caller owns and removes). A relative path is
    read from `base_dir` (the manifest's directory), as every local task source is. `bucket_options` open an s3://
    source (tracefleet.bucket.open_bucket's; default: the AWS_* environment)."""
    if uri.startswith("s3://"):
        return _download(uri, workdir, bucket_options or {})
    path = Path(uri).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if path.is_dir():
        return path
    if path.is_file() and is_tarball(path.name):
        return _unpack(path, workdir)
    if path.exists():
        raise TaskSourceError(f"{uri}: neither a directory nor a tarball ({', '.join(TARBALL_SUFFIXES)})")
    raise TaskSourceError(f"{uri}: no such file or directory")
