"""The dashboard's first view on a big job: 10,000 sessions sealed in 2,500 batches (4 a batch), in a local folder
(and with --s3, in a SeaweedFS bucket: slower to set up; then both side by side, SeaweedFS's figure as a ratio of
the folder's).

    .venv/bin/python bench/dashboard.py [--sessions 10000] [--per-batch 4] [--s3]

The first view is what `tracefleet dashboard URI` does before a person sees the job: discover the jobs, read the
manifests, serve the overview and the job's page (counts and the reward curve from manifests). The batch rows
(for the signal share, per task success and the sessions list) are read by the background reader, which runs
during the measurement as it does in the command; the bench counts the objects read to show the first view
reads manifests (a hundred at a time from the sealers' manifest packs), not batches, says whether the first view was
complete within FIRST_VIEW_TARGET_S, and then how long the rows of every batch took to read. Then what a manifest
costs to read there: the bucket client's setup, the one listing, one GET at a time and MANIFEST_READERS at a time
(the first view's cost without packs). With --s3, last, the first view of a dashboard started again over the
bucket, its manifests kept on this machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fastapi.testclient import TestClient  # noqa: E402

from fixtures.sealed_jobs import synthetic_traces, write_batches  # noqa: E402
from tracefleet.bucket import open_bucket  # noqa: E402
from tracefleet.dashboard.app import MANIFEST_BUDGET_S, REFRESH_EVERY_S, create_app  # noqa: E402
from tracefleet.contract import environment, layout  # noqa: E402
from tracefleet.dashboard.source import MANIFEST_READERS, Source, open_view  # noqa: E402

JOB = "big"
FIRST_VIEW_TARGET_S = 2.0  # every batch of the 10,000 sessions' job shown (issue 41)


class Counting:
    """Counts the objects a bucket is asked for, by kind."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.manifests = self.packs = self.data = self.other = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def get(self, key: str) -> bytes:
        if key.endswith("manifest.json"):
            self.manifests += 1
        elif f"/{layout.PACKS_DIR}/" in key:
            self.packs += 1
        elif key.endswith(".parquet"):
            self.data += 1
        else:
            self.other += 1
        return self.inner.get(key)  # type: ignore[attr-defined]


def first_view(uri: str, options: dict[str, object]) -> dict[str, float]:
    """As `tracefleet dashboard` does it: discover and read manifests (waiting at most MANIFEST_BUDGET_S for them),
    start the background reader, then a person opens the overview and the job's page. Its figures, by name."""
    t = time.perf_counter()
    source = Source(uri, **options)
    setup = time.perf_counter() - t
    counting = Counting(source.view.inner)
    source.view.inner = counting
    started = time.perf_counter()
    source.refresh(MANIFEST_BUDGET_S)
    discovered = time.perf_counter()
    found = started + source.discovered_in_s
    source.start()
    client = TestClient(create_app(source))
    index = client.get("/")
    page = client.get("/job", params={"path": JOB})
    done = time.perf_counter()
    assert index.status_code == 200 and page.status_code == 200, page.text[:500]
    f = source.jobs[JOB]
    shown = int(re.search(r"data-count='batches'>([\d,]+)<", page.text).group(1).replace(",", ""))  # type: ignore[union-attr]
    figures = {"source set up (client)": setup, "first view": done - started, "  discovery": found - started,
               "  manifests (budget)": discovered - found, "  overview + job page": done - discovered,
               "batches shown in the first view": shown}
    print(f"first view: {done - started:.2f} s (discovery {found - started:.2f} s, manifests {discovered - found:.2f} s, "
          f"overview + job page {done - discovered:.2f} s); the job page shows {shown} of {f.listed} batches; objects read: "
          f"{counting.manifests} manifests, {counting.packs} manifest packs, {counting.data} batch data objects (by the "
          "background reader meanwhile)")
    complete = "complete" if shown == f.listed else f"NOT complete ({shown} of {f.listed} batches)"
    within = "within" if shown == f.listed and done - started <= FIRST_VIEW_TARGET_S else "NOT within"
    print(f"first view {complete} in {done - started:.2f} s: {within} the {FIRST_VIEW_TARGET_S:.0f} s target")
    last = time.monotonic()
    while len(f.manifests) < f.listed:
        time.sleep(0.05)
        if time.monotonic() - last >= REFRESH_EVERY_S:  # as the open page's polls do (a failed read is read again)
            source.refresh(MANIFEST_BUDGET_S)
            last = time.monotonic()
    figures["every manifest read"] = time.perf_counter() - started
    print(f"every manifest read {figures['every manifest read']:.2f} s from the start")
    t = time.perf_counter()
    while len(f.rows) < len(f.manifests):
        time.sleep(0.1)
    print(f"background reader: every batch's rows in {time.perf_counter() - started:.1f} s from the start "
          f"({time.perf_counter() - t:.1f} s after the last manifest)")
    t = time.perf_counter()
    full = client.get("/job", params={"path": JOB})
    print(f"job page with every batch's rows (signal, per task, sessions): {time.perf_counter() - t:.2f} s")
    assert full.status_code == 200
    source.stop()
    return figures


def read_costs(uri: str, options: dict[str, object], serial: int = 200) -> dict[str, float]:
    """What one manifest costs to read: a bucket client's setup, the one listing of the batches, a GET one at a time,
    and every manifest read MANIFEST_READERS at a time (as the dashboard does)."""
    t = time.perf_counter()
    view = open_view(uri, **options)
    setup = time.perf_counter() - t
    view.check()
    t = time.perf_counter()
    seqs = view.list_dirs(layout.batches_prefix(JOB))
    listing = time.perf_counter() - t
    keys = [layout.manifest_key(JOB, int(seq)) for seq in seqs]
    t, cpu = time.perf_counter(), time.process_time()
    for key in keys[:serial]:
        view.get(key)
    one, one_cpu = (time.perf_counter() - t) / serial, (time.process_time() - cpu) / serial
    with ThreadPoolExecutor(MANIFEST_READERS) as pool:
        t = time.perf_counter()
        list(pool.map(view.get, keys))
        concurrent = time.perf_counter() - t
    print(f"client {setup * 1000:.0f} ms; listing {len(seqs)} batches {listing * 1000:.0f} ms; a manifest GET one at a time "
          f"{one * 1000:.2f} ms ({one_cpu * 1000:.2f} ms of this process's CPU); all {len(keys)}, {MANIFEST_READERS} at a time: "
          f"{concurrent:.2f} s ({len(keys) / concurrent:.0f}/s)")
    return {"bucket client set up": setup, "listing of the batches": listing, "a manifest GET, serial (ms)": one * 1000,
            "  of it this process's CPU (ms)": one_cpu * 1000, "every manifest, concurrent": concurrent}


def side_by_side(folder: dict[str, float], s3: dict[str, float]) -> None:
    print(f"\n{'':36}{'folder':>10}{'SeaweedFS':>11}{'ratio':>8}")
    for key, a in folder.items():
        b = s3[key]
        ratio = f"{b / a:.1f}x" if a >= 0.005 else "-"  # below 5 ms on a folder: no ratio worth the name
        if key.startswith("batches"):
            print(f"{key:36}{a:>8.0f}  {b:>9.0f}  {ratio:>8}")
            continue
        unit = "" if "(ms)" in key else " s"
        print(f"{key:36}{a:>8.2f}{unit:2}{b:>9.2f}{unit:2}{ratio:>8}")

def write(bucket: object, sessions: int, per_batch: int, chunk: int = 1000) -> None:
    """The job's batches, made a chunk of sessions at a time: the bench's process then holds no 10,000 traces
    (their objects would slow every garbage collection the measured pages trigger)."""
    for first in range(0, sessions, chunk):
        write_batches(bucket, JOB, synthetic_traces(first, min(chunk, sessions - first), job=JOB), per_batch)
    gc.collect()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--per-batch", type=int, default=4)
    parser.add_argument("--s3", action="store_true", help="also in a SeaweedFS bucket")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        os.environ[environment.CACHE] = str(Path(tmp) / "cache")  # the manifests kept: this bench's own
        root = Path(tmp) / "out"
        t = time.perf_counter()
        write(open_bucket(root), args.sessions, args.per_batch)
        print(f"{args.sessions} sessions in {-(-args.sessions // args.per_batch)} batches written in {time.perf_counter() - t:.0f} s")
        print("== local folder")
        folder = first_view(str(root), {}) | read_costs(str(root), {})
        if args.s3:
            from fixtures.s3 import start_seaweedfs

            server = start_seaweedfs(Path(tmp) / "seaweed")
            try:
                name = server.create_bucket()
                creds = {"endpoint_url": server.endpoint, "access_key": server.access_key, "secret_key": server.secret_key}
                t = time.perf_counter()
                write(open_bucket(f"s3://{name}/bench", **creds), args.sessions, args.per_batch)
                print(f"written to SeaweedFS in {time.perf_counter() - t:.0f} s")
                print("== SeaweedFS")
                side_by_side(folder, first_view(f"s3://{name}/bench", creds) | read_costs(f"s3://{name}/bench", creds))
                print("== SeaweedFS, the dashboard started again (its manifests kept: tracefleet.dashboard.manifest_cache)")
                first_view(f"s3://{name}/bench", creds)
            finally:
                server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
