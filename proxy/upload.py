"""Sidecar upload: when the proxy stops, put each session's capture log and the harness's artifacts
into the session's bucket prefix (`tracefleet proxy --upload-to PREFIX`).

On Kubernetes the proxy runs as a native sidecar of the harness pod: the kubelet sends it SIGTERM
once the harness container has exited. The capture log is fsync'd per record, so by then it is
complete on disk; uvicorn's shutdown closes the sessions, and only then is anything uploaded:

    PREFIX/capture.jsonl        the session's capture log (one session; with several, PREFIX/<id>/capture.jsonl)
    PREFIX/bodies/<call>.json   oversized request bodies the log refers to, if any
    PREFIX/artifacts/<path>     every regular file under --artifacts-dir (git diff, harness logs, result.json)
    PREFIX/upload.json          written last: what was uploaded (keys, sizes, sha256), so a reader knows it is whole

A run the harness entrypoint reports stopped (its pod deleted mid-session) uploads the same under
PREFIX/stopped/<ms>/ (layout.STOPPED): the session runs again, and that run must not overwrite its captured calls.

Uploading is idempotent (same keys, same bytes; a rerun overwrites with identical objects). A failed
upload is logged with what to do and the local files are left where they are. Bucket credentials come
from the environment (AWS_* / TRACEFLEET_S3_ENDPOINT), as in `tracefleet.bucket.open_bucket`.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracefleet.contract import layout
from tracefleet.contract.session import SessionStatus
from tracefleet.bucket import BucketError, open_bucket

# Native sidecars get terminationGracePeriodSeconds (30 s by default) for all of this.
UPLOAD_DEADLINE_S = 25.0
UPLOAD_ATTEMPTS = 3
# On pod deletion harness and sidecar get SIGTERM together; the harness entrypoint writes result.json
# last (tracefleet.runner.pod), so wait this long for it before taking the artifacts.
ARTIFACTS_WAIT_S = 10.0
STOPPED_STATUS: SessionStatus = "stopped"


@dataclass
class UploadReport:
    prefix: str
    uploaded: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> {bytes, sha256}
    skipped: list[str] = field(default_factory=list)  # local paths not uploaded (links, devices, ...)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _log(message: str) -> None:
    print(f"tracefleet proxy upload: {message}", file=sys.stderr, flush=True)


def _read_regular(path: Path) -> bytes | None:
    """The bytes of a regular file, never following a symlink: the harness can write the artifacts
    folder and must not make the sidecar (which holds bucket credentials) read anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _artifact_files(root: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """(relative key, path) for each regular file under root, without following links."""
    files: list[tuple[str, Path]] = []
    skipped: list[str] = []
    if not root.is_dir():
        return files, skipped
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        for d in list(dirnames):
            if (base / d).is_symlink():
                skipped.append(str(base / d))
                dirnames.remove(d)
        for name in sorted(filenames):
            path = base / name
            if path.is_symlink() or not path.is_file():
                skipped.append(str(path))
                continue
            files.append((path.relative_to(root).as_posix(), path))
    return sorted(files), skipped


def upload_outputs(prefix: str, capture_dir: Path, session_ids: list[str], artifacts_dir: Path | None) -> UploadReport:
    """Upload the sessions' capture logs and the artifacts folder under prefix; never raises."""
    report = UploadReport(prefix=prefix)
    try:
        bucket = open_bucket(prefix.rstrip("/"))
    except (BucketError, ValueError) as exc:
        report.error = f"cannot open {prefix}: {exc}"
        return report
    objects: list[tuple[str, bytes]] = []
    for sid in session_ids:
        folder = "" if len(session_ids) == 1 else f"{sid}/"
        log = capture_dir / f"{sid}.jsonl"
        # A session without calls has no log file: upload an empty one, so "no calls" is explicit.
        data = _read_regular(log) if log.exists() else b""
        objects.append((folder + layout.CAPTURE_LOG, data or b""))
        bodies = capture_dir / f"{sid}.bodies"
        files, skipped = _artifact_files(bodies)
        report.skipped += skipped
        objects += [(f"{folder}{layout.BODIES}{rel}", data) for rel, path in files if (data := _read_regular(path)) is not None]
    if artifacts_dir is not None:
        files, skipped = _artifact_files(artifacts_dir)
        report.skipped += skipped
        for rel, path in files:
            data = _read_regular(path)
            if data is None:
                report.skipped.append(str(path))
            else:
                objects.append((layout.ARTIFACTS + rel, data))
    deadline = time.monotonic() + UPLOAD_DEADLINE_S
    for key, data in objects:
        for attempt in range(1, UPLOAD_ATTEMPTS + 1):
            try:
                bucket.put(key, data)
                report.uploaded[key] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                break
            except BucketError as exc:
                if attempt == UPLOAD_ATTEMPTS or time.monotonic() > deadline:
                    report.error = f"uploading {key} to {prefix} failed: {exc}"
                    return report
                time.sleep(min(2.0 ** attempt / 2, max(0.0, deadline - time.monotonic())))
    manifest = {"sessions": session_ids, "objects": report.uploaded, "skipped": report.skipped, "uploaded_at": time.time()}
    try:
        bucket.put(layout.UPLOAD_MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    except BucketError as exc:
        report.error = f"uploading {layout.UPLOAD_MANIFEST} to {prefix} failed: {exc}"
    return report


def run_prefix(prefix: str, artifacts_dir: Path | None) -> str:
    """Where this run uploads: the session's prefix, or a folder of its own under it (layout.STOPPED) when the harness
    entrypoint says the run was stopped (its pod deleted), so the session's next run cannot overwrite what it captured."""
    result = _read_regular(artifacts_dir / layout.RESULT) if artifacts_dir is not None else None
    try:
        stopped = result is not None and json.loads(result).get("status") == STOPPED_STATUS
    except ValueError:
        stopped = False
    if not stopped:
        return prefix
    return f"{prefix.rstrip('/')}/{layout.STOPPED}{int(time.time() * 1000)}/"


def serve_then_upload(server: Any, sockets: list[Any], *, prefix: str, capture_dir: Path, session_ids: list[str],
                      artifacts_dir: Path | None) -> int:
    """Run the uvicorn server until SIGTERM/SIGINT (or it stops by itself), then upload.

    uvicorn re-raises the signal that stopped it once it has shut down; with SIGTERM's default
    action that would kill the process before the upload, so the handler here only notes it."""
    received: list[int] = []

    def note(signum: int, _frame: Any) -> None:
        received.append(signum)

    previous = {s: signal.signal(s, note) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=sockets)
    finally:
        if artifacts_dir is not None and artifacts_dir.is_dir() and not (artifacts_dir / layout.RESULT).exists():
            deadline = time.monotonic() + ARTIFACTS_WAIT_S
            while time.monotonic() < deadline and not (artifacts_dir / layout.RESULT).exists():
                time.sleep(0.1)
            if not (artifacts_dir / layout.RESULT).exists():
                _log(f"no {artifacts_dir / layout.RESULT} after {ARTIFACTS_WAIT_S:.0f}s: uploading the artifacts as they are")
        report = upload_outputs(run_prefix(prefix, artifacts_dir), capture_dir, session_ids, artifacts_dir)
        for s, handler in previous.items():
            signal.signal(s, handler)
    if report.skipped:
        _log(f"skipped {len(report.skipped)} non-regular file(s) (symlinks are never followed): {report.skipped[:5]}")
    if not report.ok:
        _log(f"FAILED: {report.error}. The local files are kept: capture logs in {capture_dir}, artifacts in "
             f"{artifacts_dir}; upload them by hand (e.g. `aws s3 cp`) or rerun the proxy with the same --upload-to.")
        return 1
    _log(f"uploaded {len(report.uploaded)} object(s) to {prefix}" + (f" after signal {received[0]}" if received else ""))
    return 0
