"""Every input the dashboard reads may be bad, and none takes a page down: a corrupt progress.json or manifest is
said on its own job (and once in the log, not at every refresh), a loop.jsonl is read once per change however many
tabs poll, a folder not there is one line and an empty page."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from fixtures.sealed_jobs import synthetic_traces, write_batches
from tracefleet.bucket import LocalBucket, open_bucket
from tracefleet.contract.layout import manifest_key, progress_key
from tracefleet.dashboard.app import create_app
from tracefleet.dashboard.source import LOOP_LOG, Source


def refreshed(client: TestClient, source: Source, route: str = "/", **params: Any) -> str:
    source.refreshed_at = -float("inf")  # the next request refreshes (at most once a second otherwise)
    r = client.get(route, params=params)
    assert r.status_code == 200, r.text
    return r.text


def test_a_corrupt_progress_or_manifest_is_shown_on_its_own_job(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    bucket = open_bucket(tmp_path / "out")
    write_batches(bucket, "healthy", synthetic_traces(0, 8, job="healthy"), 4)
    write_batches(bucket, "broken", synthetic_traces(0, 12, job="broken"), 4)
    bucket.put(progress_key("broken"), b'{"job": "broken", "driver": "local", "startedAt": ')
    bucket.put(manifest_key("broken", 1), b"{not a manifest")
    source = Source(str(tmp_path / "out"))
    client = TestClient(create_app(source))
    for _ in range(3):
        overview = refreshed(client, source)
        page = refreshed(client, source, "/job", path="broken")
    row = overview.split('href="/job?path=broken"')[1].split("</tr>")[0]
    assert "progress.json unreadable" in row and "batch 1: manifest unreadable" in row
    assert "progress.json unreadable" not in overview.split('href="/job?path=healthy"')[1].split("</tr>")[0]
    assert "data-progress='unreadable'" in page and "data-unreadable='manifest'" in page
    assert "data-reading" not in page  # not "reading manifests: 2 of 3" for ever
    assert "data-count='batches'>2<" in page and "data-count='sessions'>8<" in page
    err = capfd.readouterr().err
    assert err.count("progress unreadable") == 1 and err.count("manifest unreadable") == 1, err  # said once


def test_loop_log_is_read_once_per_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "out" / "run"
    write_batches(open_bucket(run / "batches"), "train", synthetic_traces(0, 4, job="train"), 4)
    (run / LOOP_LOG).write_text('{"step": 1, "reward_mean": 0.5}\n')
    reads: list[str] = []
    get = LocalBucket.get

    def counting(self: LocalBucket, key: str) -> bytes:
        reads.append(key)
        return get(self, key)

    monkeypatch.setattr(LocalBucket, "get", counting)
    source = Source(str(tmp_path / "out"))
    tabs = [TestClient(create_app(source)) for _ in range(3)]
    for _ in range(3):
        for tab in tabs:
            refreshed(tab, source, "/api/fingerprint")
            refreshed(tab, source, "/loop", path="run")
    assert sum(k.endswith(LOOP_LOG) for k in reads) == 1
    with (run / LOOP_LOG).open("a") as f:
        f.write('{"step": 2, "reward_mean": 0.75}\n')
    assert "data-count='steps'>2<" in refreshed(tabs[0], source, "/loop", path="run")
    assert sum(k.endswith(LOOP_LOG) for k in reads) == 2


def test_a_folder_not_there_is_one_line_at_start(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "tracefleet.cli", "dashboard", str(tmp_path / "typo"), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert proc.stdout and "http://" in proc.stdout.readline()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tracefleet dashboard: ") and "does not exist" in lines[0], err
    assert str(tmp_path / "typo") in lines[0]
