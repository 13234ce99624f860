"""The dashboard's pages without a browser (FastAPI's test client): what discovery finds under a URI (jobs, a
`tracefleet train` run folder with its loop.jsonl and held-out jobs, a job's own folder), the loop's per-step
curves and the comparison of two loops, failed and quarantined sessions by kind, charts before any data, the
read-only view refusing writes, and a store it cannot reach said in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fixtures.sealed_jobs import synthetic_traces, write_batches
from tracefleet.bucket import open_bucket
from tracefleet.contract.job import Counters
from tracefleet.contract.layout import evidence_key, progress_key
from tracefleet.contract.progress import LOCAL, JobProgress
from tracefleet.diagnostics.evidence import SessionEvidence
from tracefleet.dashboard.app import create_app
from tracefleet.dashboard.charts import line_chart
from tracefleet.dashboard.figures import LOOP_FIGURES
from tracefleet.dashboard.source import LOOP_LOG, ReadOnly, Source


def loop_folder(run: Path, steps: int, reward0: float = 0.0) -> None:
    """A `tracefleet train` run folder as the loop leaves it: loop.jsonl, its job's batches, held-out scores."""
    write_batches(open_bucket(run / "batches"), "quickstart", synthetic_traces(0, 8, job="quickstart"), 4)
    write_batches(open_bucket(run / "held-out-before"), "held", synthetic_traces(100, 4, job="held"), 4)
    (run / "checkpoints" / "policy-1").mkdir(parents=True)
    records = [{"step": i + 1, "version": i + 1, "reward_mean": reward0 + 0.1 * i, "groups": 4, "groups_with_signal": i % 3,
                "loss": 0.5 - 0.01 * i, "clipped_share": 0.0, "mean_abs_dlogprob": 0.01, "sync_s": 2.5, "paused_s": 1.2,
                "stale_tokens_masked": 0} for i in range(steps)]
    (run / LOOP_LOG).write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": ')  # a line being written


def test_jobs_and_loops_under_one_prefix(tmp_path: Path) -> None:
    write_batches(open_bucket(tmp_path / "out"), "alpha", synthetic_traces(0, 12, job="alpha"), 4)
    loop_folder(tmp_path / "out" / "runs" / "a", 5)
    loop_folder(tmp_path / "out" / "runs" / "b", 3, reward0=0.3)
    source = Source(str(tmp_path / "out"))
    source.refresh()
    assert sorted(source.jobs) == ["alpha", "runs/a/batches/quickstart", "runs/a/held-out-before/held",
                                   "runs/b/batches/quickstart", "runs/b/held-out-before/held"]
    assert sorted(source.loops) == ["runs/a", "runs/b"] and source.loops["runs/a"].jobs == ["runs/a/batches/quickstart"]
    client = TestClient(create_app(source))
    loop = client.get("/loop", params={"path": "runs/a"}).text
    for key, _ in LOOP_FIGURES:
        assert loop.count(f'id="chart-{key}"') == 1
    assert 'data-points-reward-mean="5"' in loop and "Held-out reward" in loop
    both = client.get("/compare", params={"a": "runs/a", "b": "runs/b"}).text
    assert 'data-points-runs-a="5"' in both and 'data-points-runs-b="3"' in both
    index = client.get("/").text
    assert index.count('href="/job?') == 5 and index.count('href="/loop?') == 2 and "/compare?" in index
    assert client.get("/api/job", params={"path": "alpha"}).json()["sessions"] == 12
    assert client.get("/job", params={"path": "nope"}).status_code == 404


def test_a_jobs_own_folder_and_a_folder_not_there_yet(tmp_path: Path) -> None:
    write_batches(open_bucket(tmp_path / "out"), "alpha", synthetic_traces(0, 8, job="alpha"), 4)
    own = Source(str(tmp_path / "out" / "alpha"))
    own.refresh()
    assert list(own.jobs) == ["alpha"] and len(own.jobs["alpha"].manifests) == 2
    later = Source(str(tmp_path / "later"))
    later.refresh()
    assert not later.jobs and "nothing sealed" in TestClient(create_app(later)).get("/").text
    assert not (tmp_path / "later").exists()  # looking did not create it


def test_charts_before_any_point() -> None:
    svg = line_chart("chart-x", "t", [0, 1], {"a": [None, None]})
    assert "no data yet" in svg and 'data-points-a="0"' in svg
    assert "<script" not in line_chart("chart-y", "t", [0, 1], {"a": [0.5, None]})  # nothing to fetch or run


def test_the_view_refuses_every_write(tmp_path: Path) -> None:
    write_batches(open_bucket(tmp_path / "out"), "alpha", synthetic_traces(0, 4, job="alpha"), 4)
    source = Source(str(tmp_path / "out"))
    source.refresh()
    view = source.jobs["alpha"].view
    for write in (lambda: view.put("x", b""), lambda: view.create_exclusive("x", b""), lambda: view.delete("x"),
                  lambda: view.put_file("x", tmp_path)):
        with pytest.raises(ReadOnly):
            write()


def test_failed_and_quarantined_sessions_by_kind(tmp_path: Path) -> None:
    traces = synthetic_traces(0, 8, job="alpha")
    traces[0].meta.outcome, traces[0].meta.reward = "fail_closed", 0.0
    traces[0].meta.fail_closed_reasons = ["session_timeout:harness"]
    traces[5].meta.quarantined, traces[5].meta.reward = True, 0.0
    traces[5].meta.diagnostics = [{"name": "protected_files", "severity": "error", "message": "edited the tests",
                                   "action": "quarantine", "file": "test_calc.py"}]
    write_batches(open_bucket(tmp_path / "out"), "alpha", traces, 4)
    source = Source(str(tmp_path / "out"))
    source.refresh()
    for seq in source.jobs["alpha"].manifests:
        source.jobs["alpha"].load_rows(seq)
    client = TestClient(create_app(source))
    page = client.get("/job", params={"path": "alpha"}).text
    assert "<td>session_timeout:harness</td><td>1</td>" in page  # fail-closed reasons: sessions by reason
    assert "<td>protected_files</td><td>1</td><td>1</td>" in page  # diagnostics: findings, quarantined
    failed = page.split("class='failed'")[1].split("</table>")[0]
    assert failed.count("/session?") == 2 and "sess-000000" in failed and "sess-000005" in failed
    session = client.get("/session", params={"path": "alpha", "session": "sess-000005"}).text
    assert "edited the tests" in session and "test_calc.py" in session


def test_a_store_it_cannot_reach_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    r = subprocess.run([sys.executable, "-m", "tracefleet.cli", "dashboard", "s3://rollouts/team", "--endpoint-url",
                        "http://127.0.0.1:1", "--port", "0"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.startswith("tracefleet dashboard: cannot reach s3://rollouts/team") and r.stderr.count("\n") == 1, r.stderr


def test_finished_sessions_not_yet_sealed(tmp_path: Path) -> None:
    bucket = open_bucket(tmp_path / "out")
    write_batches(bucket, "alpha", synthetic_traces(0, 4, job="alpha"), 4)
    for i in range(6):  # every finished session leaves its evidence; two of them are not in a batch yet
        sid = f"sess-{i:06d}"
        bucket.put(evidence_key("alpha", sid), SessionEvidence(job="alpha", session_id=sid, task_id="add").model_dump_json().encode())
    source = Source(str(tmp_path / "out"))
    source.refresh()
    source.jobs["alpha"].count_finished()
    page = TestClient(create_app(source)).get("/job", params={"path": "alpha"}).text
    assert "data-count='sessions'>4<" in page and "data-count='waiting'>2<" in page


def test_a_job_shows_its_progress_before_its_first_batch(tmp_path: Path) -> None:
    """The driver's progress object is enough for the job to show: running count and ETA, counted down from when
    it was written; once written finished, the ETA says done."""
    bucket = open_bucket(tmp_path / "out")
    now = datetime.now(timezone.utc)
    progress = JobProgress(job="warming", driver=LOCAL, counters=Counters(total=40, pending=30, running=4, succeeded=5, failed=1),
                           calls=17, started_at=now - timedelta(seconds=60), updated_at=now - timedelta(seconds=10), eta_s=400)
    bucket.put(progress_key("warming"), progress.to_json())
    client = TestClient(create_app(Source(str(tmp_path / "out"))))
    overview = client.get("/").text
    assert "/job?path=warming" in overview and "6 / 40" in overview
    page = client.get("/job", params={"path": "warming"}).text
    assert "data-count='running'>4<" in page and "data-count='finished'>6<" in page and "data-progress='running'" in page
    assert "data-eta='6 min'" in page  # 400 s written 10 s ago
    assert client.get("/api/job", params={"path": "warming"}).json()["progress"]["counters"]["running"] == 4
    bucket.put(progress_key("warming"), progress.model_copy(update={"finished": True, "eta_s": None}).to_json())
    client.get("/api/fingerprint")  # a refresh (at most one a second)
    time.sleep(1.1)
    assert "data-eta='done'" in client.get("/job", params={"path": "warming"}).text
