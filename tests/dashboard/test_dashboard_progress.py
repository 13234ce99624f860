"""The progress a local run writes for the dashboard (runner/progress.py): the newest only, from a thread of its own,
so a slow bucket never holds up the sessions, and a bucket that refuses it is said once."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from tracefleet.bucket import BucketUnreachable, open_bucket
from tracefleet.contract.job import Counters
from tracefleet.contract.layout import progress_key
from tracefleet.contract.progress import LOCAL, JobProgress
from tracefleet.runner.progress import ProgressWriter


def progress(done: int, finished: bool = False) -> JobProgress:
    now = datetime.now(timezone.utc)
    return JobProgress(job="j", driver=LOCAL, counters=Counters(total=9, succeeded=done), started_at=now, updated_at=now,
                       finished=finished)


def test_the_newest_is_written_and_a_slow_bucket_holds_nothing_up(tmp_path: Path) -> None:
    bucket = open_bucket(tmp_path)
    release = threading.Event()

    class Slow:
        def put(self, key: str, data: bytes) -> None:
            release.wait(5)
            bucket.put(key, data)

    writer = ProgressWriter(Slow(), "j", print)
    started = time.monotonic()
    for done in range(1, 6):
        writer.offer(progress(done))
    assert time.monotonic() - started < 0.5  # offering never waits for the bucket
    release.set()
    writer.close(progress(9, finished=True))
    last = JobProgress.model_validate_json(bucket.get(progress_key("j")))
    assert last.finished and last.counters.succeeded == 9


def test_a_bucket_that_refuses_it_is_said_once() -> None:
    said: list[str] = []

    class Down:
        def put(self, key: str, data: bytes) -> None:
            raise BucketUnreachable("cannot reach s3://b at http://127.0.0.1:1")

    writer = ProgressWriter(Down(), "j", said.append)
    for done in range(3):
        writer.offer(progress(done))
        time.sleep(0.05)
    writer.close(progress(3, finished=True))
    assert len(said) == 1 and "progress not written to j/progress.json: cannot reach" in said[0]
