"""What the dashboard reads: the jobs and training loops under one URI, through a read-only view of the bucket.

Discovery walks folders (`list_dirs`), never every object: a job is a folder whose `batches/` holds sealed
seq folders (tracefleet.contract.layout), or that holds the progress its driver writes before the first one
(tracefleet.contract.progress), a loop is a `tracefleet train` run folder (it holds `loop.jsonl`,
its job's batches under `batches/<job>/`). Manifests are read first and kept (a sealed batch never changes),
so a view costs one listing per job plus the manifests sealed since the last one. A batch's rows (the
scalar columns only, never the token lists) are read by a background thread, oldest first, for what
manifests do not hold: groups with signal, per task success, fail-closed reasons, the sessions; it waits while
a page is being answered and while manifests are being read.

Nothing here writes: the view refuses every write, and no cursor is read or moved (the dashboard reads
batches by seq, not as a consumer).
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from tracefleet.bucket import BucketError, BucketNotFound, ObjectInfo, ObjectNotFound, open_bucket
from tracefleet.contract import layout
from tracefleet.contract.batch import BatchManifest, ManifestPack
from tracefleet.contract.progress import JobProgress, progress_state
from tracefleet.dashboard.manifest_cache import ManifestCache
from tracefleet.traces.rejudge import Rejudged, Rejudging, current_rejudgings, read_as_now, rejudged_manifest

LOOP_LOG = "loop.jsonl"  # a `tracefleet train` run's per-step records (tracefleet.trainer.loop)
LOOP_BATCHES = "batches"  # a loop's own bucket folder inside its run folder
# folders that never hold a job or a loop: a job's own parts, a loop's checkpoints and work folders
_NOT_A_JOB = {layout.SESSIONS, layout.EVIDENCE_DIR, layout.OVERLAYS_DIR, layout.REJUDGED_DIR, layout.PACKS_DIR,
              layout.CONSUMERS, "checkpoints", "work", "tensorboard"}
_SEQ = re.compile(r"^\d{6,}$")
MAX_DEPTH = 5
MANIFEST_READERS = 16
PACK_WORTH_IT = 10  # batches of a manifest pack's hundred still to read for the pack to be read instead
COUNT_FINISHED_EVERY_S = 5.0  # a listing of every session's evidence: not at every poll
# a batch's columns the dashboard reads: scalars and short lists, not the token streams
ROW_COLUMNS = ["trace_id", "session_id", "task_id", "group_id", "sample_index", "reward", "evaluator_reward", "outcome",
               "outcome_kind",
               "fail_closed_reasons", "quarantined", "diagnostics", "new_root_reason", "num_tokens", "num_trainable"]


_said: set[str] = set()
_said_lock = threading.Lock()


def say_once(line: str) -> None:
    """A problem with what is read, on stderr once (the pages show it where it is): never again at every refresh."""
    with _said_lock:
        if line in _said:
            return
        _said.add(line)
    print(f"dashboard: {line}", file=sys.stderr, flush=True)


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class ReadOnly(BucketError):
    """The dashboard tried to write: it never may."""


class ReadOnlyView:
    """A bucket seen under `prefix`, for reading only: every write raises ReadOnly."""

    def __init__(self, inner: Any, prefix: str = "") -> None:
        self.inner = inner
        self.prefix = prefix.strip("/")
        self.uri = inner.uri.rstrip("/") + (f"/{self.prefix}" if self.prefix else "")

    def _k(self, key: str) -> str:
        return "/".join(p for p in (self.prefix, key.strip("/")) if p)

    def scoped(self, prefix: str) -> ReadOnlyView:
        return ReadOnlyView(self.inner, self._k(prefix))

    def get(self, key: str) -> bytes:
        return self.inner.get(self._k(key))

    def get_if_changed(self, key: str, stamp: str | None) -> tuple[bytes, str] | None:
        return self.inner.get_if_changed(self._k(key), stamp)

    def exists(self, key: str) -> bool:
        return self.inner.exists(self._k(key))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        cut = len(self.prefix) + 1 if self.prefix else 0
        for obj in self.inner.list(self._k(prefix)):
            yield ObjectInfo(key=obj.key[cut:], size=obj.size, stamp=obj.stamp)

    def list_dirs(self, prefix: str = "") -> list[str]:
        return self.inner.list_dirs(self._k(prefix))

    def check(self) -> None:
        self.inner.check()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise ReadOnly(f"the dashboard reads {self.uri} and never writes to it")

    put = put_file = create_exclusive = delete = _refuse


def open_view(uri: str, **options: Any) -> ReadOnlyView:
    if not str(uri).startswith("s3://"):
        options = {"create": False}
    else:
        options = {"max_pool_connections": MANIFEST_READERS, **options}
    return ReadOnlyView(open_bucket(uri, **options))


@dataclass
class JobSource:
    """One job: `path` is its folder under the URI (the key the pages name it by)."""

    view: ReadOnlyView  # the job's bucket (the folder holding the job's folder)
    name: str
    path: str
    manifests: dict[int, BatchManifest] = field(default_factory=dict)
    rows: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # by seq: one dict per trace
    listed: int = 0  # seq folders at the last listing (a manifest or two may still be on its way)
    finished: int | None = None  # sessions with evidence in the bucket (written when a session finishes)
    counted_at: float = -float("inf")
    progress: JobProgress | None = None  # what the job's driver last wrote (<job>/progress.json)
    progress_error: str | None = None  # why the progress object does not read (shown on the job's page)
    bad_manifests: dict[int, str] = field(default_factory=dict)  # seq: why its manifest does not read
    bad_rows: dict[int, str] = field(default_factory=dict)  # seq: why its rows do not read
    _reading: set[int] = field(default_factory=set)  # seqs whose manifest is being read
    _progress_stamp: str | None = None
    cache: ManifestCache | None = None  # manifests kept between starts (a bucket where each read is a round trip)
    # what reruns judged again (tracefleet.traces.rejudge): the rows and counts shown are as a reader reads them
    rejudged: Rejudged = field(default_factory=Rejudged)
    rejudged_at: float = -float("inf")
    _rejudgings: dict[str, Rejudging] = field(default_factory=dict)

    def refresh(self, pool: ThreadPoolExecutor, deadline: float | None = None,
                rendering: Callable[[], bool] = lambda: False) -> None:
        """Read the manifests of the batches sealed since the last refresh: one listing of the seq folders (not of
        every object), then the new manifests, MANIFEST_READERS at a time (on S3 each is a round trip), waiting for
        them until `deadline` (time.monotonic(); None: all): the rest land while the page is already shown, each read waiting while a page
        is being made (`rendering`: the GIL is one, the person's page goes first). A seq folder without its
        manifest is a batch being sealed: not there yet."""
        self.read_progress()
        if time.monotonic() - self.rejudged_at >= COUNT_FINISHED_EVERY_S:
            self.read_rejudgings()
        stamps, names = self._listed_manifests() if self.cache is not None else ({}, {})
        seqs = sorted(stamps) if self.cache is not None else sorted(
            int(d) for d in self.view.list_dirs(layout.batches_prefix(self.name)) if _SEQ.match(d))
        self.listed = len(seqs)
        todo = []
        for seq in seqs:
            if seq in self.manifests or seq in self._reading or seq in self.bad_manifests:
                continue
            kept = self.cache.get(self._cache_key(seq), stamps[seq]) if self.cache is not None else None
            if kept is not None:
                self._keep(kept)
                continue
            todo.append(seq)
        if todo:
            self._read_packs(pool, todo, stamps, names, deadline)
        futures = []
        for seq in todo:
            if seq in self.manifests:
                continue  # it came in a pack
            self._reading.add(seq)
            futures.append(pool.submit(self._read_manifest, seq, rendering, stamps.get(seq, "")))
        if futures:
            wait(futures, timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _keep(self, sealed: BatchManifest) -> None:
        """A batch's manifest as shown: its counts as its rows read now (a rerun may have judged some again)."""
        self.manifests[sealed.seq] = rejudged_manifest(sealed, self.rejudged.batches)

    def read_rejudgings(self) -> None:
        """What reruns judged again (one listing; each object fetched once): the manifests they recounted shown so,
        the rows of their batches read again with the verdicts."""
        self.rejudged_at = time.monotonic()
        try:
            found = current_rejudgings(self.view, self.name, self._rejudgings)
        except ValueError as exc:  # an object that does not read: the sealed verdicts stay shown
            say_once(f"{self.path}: a re-judging unreadable: {_validation_line(exc)}")
            return
        changed = {seq for seq, counts in found.batches.items() if self.rejudged.batches.get(seq) != counts}
        changed |= {seq for seq in self.rows if found.superseded != self.rejudged.superseded}
        self.rejudged = found
        for seq in changed:
            if seq in self.manifests:
                self._keep(self.manifests[seq])
            self.rows.pop(seq, None)

    def read_progress(self) -> None:
        """The running count and ETA the job's driver writes as it goes (a job sealed by an older tracefleet: none).
        A record that does not read is this job's problem, shown on its page: the last good one is not shown as
        current."""
        try:
            found = self.view.get_if_changed(layout.progress_key(self.name), self._progress_stamp)
        except ObjectNotFound:
            return
        if found is None:
            return  # not rewritten since the last read
        data, self._progress_stamp = found
        try:
            self.progress, self.progress_error = JobProgress.model_validate_json(data), None
        except ValueError as exc:
            self.progress, self.progress_error = None, _validation_line(exc)
            say_once(f"{self.path}: progress unreadable: {self.progress_error}")

    def _listed_manifests(self) -> tuple[dict[int, str], dict[int, set[str]]]:
        """({seq: its manifest's stamp}, {seq: its objects' names}) from one listing of the job's batches (every
        object: a page holds 1,000, two objects a batch), where only sealed batches have a manifest."""
        found: dict[int, str] = {}
        names: dict[int, set[str]] = {}
        for obj in self.view.list(layout.batches_prefix(self.name)):
            parts = obj.key.rsplit("/", 2)
            if len(parts) == 3 and _SEQ.match(parts[1]):
                names.setdefault(int(parts[1]), set()).add(parts[2])
                if parts[2] == layout.MANIFEST:
                    found[int(parts[1])] = obj.stamp
        return found, names

    def _read_packs(self, pool: ThreadPoolExecutor, todo: list[int], stamps: dict[int, str],
                    names: dict[int, set[str]], deadline: float | None) -> None:
        """The manifests of `todo` that manifest packs hold (tracefleet.contract.batch.ManifestPack: one object for a
        hundred batches), where a pack's range misses at least PACK_WORTH_IT of them (else one listing more would
        cost what it saves). A pack's manifest is taken for a listed batch only, and, where the listing named the
        batch's objects, only when its data object is the one listed (a job run again under its name)."""
        size = layout.MANIFEST_PACK_SIZE
        missing = Counter(seq // size * size for seq in todo)
        worth = {first for first, n in missing.items() if n >= PACK_WORTH_IT}
        if not worth:
            return
        try:
            firsts = [f for obj in self.view.list(layout.packs_prefix(self.name))
                      if (f := layout.manifest_pack_first(obj.key)) is not None and f in worth]
        except BucketError:
            return
        listed = set(todo)

        def read(first: int) -> None:
            try:
                pack = ManifestPack.model_validate_json(self.view.get(layout.manifest_pack_key(self.name, first)))
            except (BucketError, ValueError):
                return  # the batches' own manifests are read instead
            for manifest in pack.manifests:
                seq = manifest.seq
                if seq not in listed or (seq in names and not {o.name for o in manifest.objects} <= names[seq]):
                    continue
                self._keep(manifest)
                if self.cache is not None:
                    self.cache.put(self._cache_key(seq), stamps.get(seq, ""), manifest.model_dump_json().encode())

        futures = [pool.submit(read, first) for first in firsts]
        wait(futures, timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _cache_key(self, seq: int) -> str:
        return f"{self.view.uri}/{layout.manifest_key(self.name, seq)}"

    def _read_manifest(self, seq: int, rendering: Callable[[], bool], stamp: str = "") -> None:
        while rendering():
            time.sleep(0.005)
        try:
            data = self.view.get(layout.manifest_key(self.name, seq))
            self._keep(BatchManifest.model_validate_json(data))
            if self.cache is not None:
                self.cache.put(self._cache_key(seq), stamp, data)
        except (ObjectNotFound, BucketError):
            pass  # not there yet (a batch being sealed), or the bucket hiccuped: the next refresh tries again
        except ValueError as exc:  # written once, never rewritten (a conditional create): it stays unreadable
            self.bad_manifests[seq] = _validation_line(exc)
            say_once(f"batch {seq} of {self.path}: manifest unreadable: {self.bad_manifests[seq]}")
        finally:
            self._reading.discard(seq)

    def load_rows(self, seq: int) -> list[dict[str, Any]]:
        if seq not in self.rows:
            manifest = self.manifests[seq]
            rows: list[dict[str, Any]] = []
            for obj in manifest.objects:
                data = self.view.get(layout.batch_object_key(self.name, seq, obj.name))
                schema = pq.read_schema(io.BytesIO(data))
                columns = [c for c in ROW_COLUMNS if c in schema.names]
                table = pq.read_table(io.BytesIO(data), columns=columns)
                rows += read_as_now(table, self.rejudged, seq).to_pylist()
            for r in rows:
                r["seq"] = seq
            self.rows[seq] = rows
        return self.rows[seq]

    def count_finished(self) -> None:
        """Sessions that finished, sealed or not: their evidence objects (one listing of the evidence folder)."""
        self.finished = sum(1 for _ in self.view.list(f"{layout.job_root(self.name)}/{layout.EVIDENCE_DIR}/"))
        self.counted_at = time.monotonic()

    def evidence(self, session_id: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.view.get(layout.evidence_key(self.name, session_id)))
        except ObjectNotFound:
            return None


@dataclass
class LoopSource:
    """One `tracefleet train` run folder: its steps (loop.jsonl) and its job(s) under `batches/`."""

    view: ReadOnlyView  # the run folder
    path: str
    jobs: list[str] = field(default_factory=list)  # paths of its jobs

    _steps: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: list[str] = field(default_factory=list)  # "line N: why" of the lines that do not read
    _stamp: str | None = None

    def steps(self) -> list[dict[str, Any]]:
        """The steps as last read (`read`, at each refresh)."""
        return self._steps

    def read(self) -> None:
        """loop.jsonl again if it changed since the last read (else nothing is read): its steps, each a JSON object;
        a line that is not one is counted, not shown, and its figures that are not finite numbers are left out
        (a line being written is not a bad line: the last one, without its newline)."""
        try:
            found = self.view.get_if_changed(LOOP_LOG, self._stamp)
        except ObjectNotFound:
            self._steps, self.bad_lines, self._stamp = [], [], None
            return
        if found is None:
            return
        data, self._stamp = found
        text = data.decode("utf-8", "replace")
        lines = text.split("\n")
        steps, bad = [], []
        for n, line in enumerate(lines, 1):
            if not line.strip() or (n == len(lines) and not text.endswith("\n")):
                continue
            try:
                step = json.loads(line)
            except ValueError as exc:
                bad.append(f"line {n}: {exc}")
                continue
            if not isinstance(step, dict):
                bad.append(f"line {n}: a {type(step).__name__}, not an object")
                continue
            steps.append(step)
        for b in bad[:1]:
            say_once(f"{self.path or '.'}/{LOOP_LOG}: {len(bad)} line(s) unreadable, the first {b}")
        self._steps, self.bad_lines = steps, bad


def _validation_line(exc: ValueError) -> str:
    """A pydantic error in one line: how many problems, the first one."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        found = errors()
        if found:
            where = ".".join(str(x) for x in found[0].get("loc", ())) or "the object"
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            return f"{where}: {found[0].get('msg')}{more}"
    return first_line(exc)


class Source:
    """Everything under a URI, refreshed on demand; batch rows loaded in the background."""

    def __init__(self, uri: str, progress_from: Callable[[], dict[str, JobProgress]] | None = None,
                 **bucket_options: Any) -> None:
        """`progress_from`: the progress of jobs whose driver keeps it elsewhere than the bucket (a cluster's
        RolloutJobs: tracefleet.dashboard.cluster), by their path under `uri`."""
        self.uri = uri if uri.startswith("s3://") else os.path.abspath(uri.removeprefix("file://"))
        self._progress_from = progress_from
        self._options = bucket_options
        self.view = open_view(uri, **bucket_options)
        # manifests kept between starts where each read is a round trip; a folder's are read faster than a cache's
        self._cache = ManifestCache(self.uri) if self.uri.startswith("s3://") else None
        self._root = ""  # the folder discovery starts in
        self.jobs: dict[str, JobSource] = {}
        self.loops: dict[str, LoopSource] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._loader: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(MANIFEST_READERS, thread_name_prefix="dashboard-manifests")
        self.refreshed_at = -float("inf")  # time.monotonic() of the last refresh
        self.missing: str | None = None  # the folder or bucket is not there (yet): why
        self.problem: str | None = None  # the last refresh failed: why (the pages show what was read before)
        self.discovered_in_s = 0.0  # the last refresh's discovery (bench/dashboard.py says it)
        self._serving = 0  # requests being answered: the background reader waits for them (the GIL is one)
        self._rendering = 0  # pages being made from what is read: manifest reads wait for them

    @contextmanager
    def _counted(self, name: str) -> Iterator[None]:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)
        try:
            yield
        finally:
            with self._lock:
                setattr(self, name, getattr(self, name) - 1)

    def serving(self) -> Any:
        return self._counted("_serving")

    def rendering(self) -> Any:
        return self._counted("_rendering")

    def is_rendering(self) -> bool:
        return self._rendering > 0

    # discovery ------------------------------------------------------------------------------------
    def discover(self) -> None:
        try:
            self.view.check()
        except BucketNotFound as exc:
            self.missing = first_line(exc)  # not there yet (a run that has not sealed anything), or a typo
            return
        self.missing = None
        if self._root == "" and self._is_job(""):
            # the URI names one job's own folder: read it from the folder above, where the sealer's bucket is
            self.uri, self._root = self.uri.rstrip("/").rsplit("/", 1)
            self.view = open_view(self.uri, **self._options)
        found_jobs: dict[str, tuple[str, str]] = {}
        found_loops: dict[str, list[str]] = {}
        self._walk(self._root, 0, found_jobs, found_loops)
        with self._lock:
            for path, (parent, name) in found_jobs.items():
                if path not in self.jobs:
                    self.jobs[path] = JobSource(self.view.scoped(parent), name, path, cache=self._cache)
            for path, jobs in found_loops.items():
                loop = self.loops.setdefault(path, LoopSource(self.view.scoped(path), path))
                loop.jobs = jobs

    def _is_job(self, prefix: str, dirs: list[str] | None = None) -> bool:
        """A folder with sealed batches, or a job's progress before its first batch is sealed."""
        dirs = self.view.list_dirs(prefix) if dirs is None else dirs
        if layout.BATCHES in dirs and any(_SEQ.match(d) for d in self.view.list_dirs(_join(prefix, layout.BATCHES))):
            return True
        return self.view.exists(_join(prefix, layout.PROGRESS))

    def _walk(self, prefix: str, depth: int, jobs: dict[str, tuple[str, str]], loops: dict[str, list[str]]) -> None:
        known = prefix in self.jobs  # its batches are listed by its own refresh: not again here
        dirs = [] if known else self.view.list_dirs(prefix)
        if known or prefix and self._is_job(prefix, dirs):
            parent, _, name = prefix.rpartition("/")
            jobs[prefix] = (parent, name)
            return
        if self.view.exists(_join(prefix, LOOP_LOG)):
            loop_jobs: dict[str, tuple[str, str]] = {}
            self._walk(_join(prefix, LOOP_BATCHES), depth + 1, loop_jobs, loops)
            jobs.update(loop_jobs)
            loops[prefix] = sorted(loop_jobs)
            dirs = [d for d in dirs if d != LOOP_BATCHES]
        if depth >= MAX_DEPTH:
            return
        for d in dirs:
            if d not in _NOT_A_JOB and not d.startswith("."):
                self._walk(_join(prefix, d), depth + 1, jobs, loops)

    def _cluster_progress(self, found: dict[str, JobProgress]) -> None:
        """A cluster job shows from its RolloutJob's status, before its first batch is in the bucket."""
        with self._lock:
            for path, progress in found.items():
                if path not in self.jobs:
                    parent, _, name = path.rpartition("/")
                    self.jobs[path] = JobSource(self.view.scoped(parent), name, path, cache=self._cache)
                self.jobs[path].progress = progress

    def refresh(self, budget_s: float | None = None, *, strict: bool = False) -> None:
        """Discover, and read new manifests; `budget_s` (None: no limit) bounds the whole refresh, the listings
        included and every job's manifests together: what a page waits before it is shown. The bucket failing
        meanwhile is `problem` (said once), never an error for the page (`strict`: raised, as at start)."""
        try:
            self._refresh(budget_s)
            self.problem = None
        except BucketError as exc:
            if strict:
                raise
            self.problem = first_line(exc)
            say_once(f"cannot read {self.uri} now: {self.problem}")
        finally:
            self.refreshed_at = time.monotonic()

    def _refresh(self, budget_s: float | None) -> None:
        started = time.monotonic()
        deadline = None if budget_s is None else started + budget_s
        self.discover()
        if self._progress_from is not None:
            self._cluster_progress(self._progress_from())
        self.discovered_in_s = time.monotonic() - started
        for job in list(self.jobs.values()):
            job.refresh(self._pool, deadline, self.is_rendering)
        for loop in list(self.loops.values()):
            loop.read()
        self._wake.set()

    # rows, in the background ---------------------------------------------------------------------
    def start(self) -> Source:
        self._loader = threading.Thread(target=self._load_rows, name="dashboard-rows", daemon=True)
        self._loader.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _load_rows(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=5)
            self._wake.clear()
            for job in list(self.jobs.values()):
                if time.monotonic() - job.counted_at >= COUNT_FINISHED_EVERY_S:
                    try:
                        job.count_finished()
                    except BucketError:
                        pass  # the next wake tries again
                for seq in sorted(job.manifests):
                    if self._stop.is_set():
                        return
                    # pages first, then manifests (the counts and curves of every batch), then rows
                    while (self._serving or self._reading_manifests()) and not self._stop.is_set():
                        time.sleep(0.02)
                    if seq not in job.rows:
                        try:
                            job.load_rows(seq)
                        except BucketError:
                            break  # the bucket hiccuped: the next wake tries again
                        except Exception as exc:  # noqa: BLE001 - one unreadable batch must not stop the others
                            job.rows[seq] = []
                            job.bad_rows[seq] = first_line(exc)
                            say_once(f"batch {seq} of {job.path}: rows unreadable: {job.bad_rows[seq]}")

    def _reading_manifests(self) -> bool:
        return any(job._reading for job in list(self.jobs.values()))

    def fingerprint(self) -> str:
        """Changes whenever what the pages show may have: new batches, new rows, a loop's new steps."""
        parts = [f"{p}:{len(j.manifests)}:{len(j.rows)}:{j.finished}:{j.progress.updated_at if j.progress else ''}:"
                 f"{progress_state(j.progress).kind if j.progress else j.progress_error}:{len(j.bad_manifests)}"
                 for p, j in sorted(self.jobs.items())]  # the state too: a driver gone changes nothing it wrote
        parts += [f"{path}:{len(loop.steps())}:{len(loop.bad_lines)}" for path, loop in sorted(self.loops.items())]
        return "|".join(parts)


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))
