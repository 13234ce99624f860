"""Manifests kept on this machine between starts of the dashboard, for a bucket (S3) where each is a round trip.

A sealed manifest is written once (a conditional create) and never rewritten, so a copy stays true while the
bucket's listing shows the object with the same stamp (its ETag): a dashboard started again over a bucket of
thousands of batches shows them at once and reads only the manifests sealed since, or rewritten (a job deleted and
run again under the same name). One file per bucket folder the dashboard reads, under
$TRACEFLEET_CACHE/dashboard/; a cache that cannot be read starts empty, one that cannot be written is not kept.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from tracefleet.contract.batch import BatchManifest
from tracefleet.contract.environment import cache_dir

CACHE_FOLDER = "dashboard"


class ManifestCache:
    def __init__(self, uri: str, folder: Path | None = None) -> None:
        name = hashlib.sha256(uri.encode()).hexdigest()[:24]
        self.path = (folder or cache_dir() / CACHE_FOLDER) / f"manifests-{name}.jsonl"
        self._entries: dict[str, tuple[str, str]] = {}  # object URI: (its stamp, the manifest's JSON)
        self._lock = threading.Lock()
        self._writable = True
        try:
            for line in self.path.read_text().splitlines():
                entry = json.loads(line)
                self._entries[entry["key"]] = (entry["stamp"], entry["manifest"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none yet, or cut off by a crash mid-line: what read is kept, the rest is read from the bucket

    def get(self, key: str, stamp: str) -> BatchManifest | None:
        found = self._entries.get(key)
        if not stamp or found is None or found[0] != stamp:
            return None
        try:
            return BatchManifest.model_validate_json(found[1])
        except ValueError:
            return None

    def put(self, key: str, stamp: str, manifest: bytes) -> None:
        if not stamp or not self._writable:
            return
        text = manifest.decode("utf-8", "replace")
        line = json.dumps({"key": key, "stamp": stamp, "manifest": text}) + "\n"
        with self._lock:
            self._entries[key] = (stamp, text)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a") as f:  # the newest entry of a key is the one that counts
                    f.write(line)
            except OSError:
                self._writable = False  # a read-only home (a pod): the dashboard works without it
