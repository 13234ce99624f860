"""`tracefleet dashboard` as a person watches it, in real headless Chromium (driven over the DevTools protocol):

- on a real local run (`tracefleet run` of the quickstart's tasks, sized down, on the CPU engine): the page is
  open before anything is sealed and shows the job and its batches as they land, without a reload; while it
  runs, the sessions running and an ETA (the run's progress object); when the run is done its counts are
  what `BatchReader` reads, the reward curve has one point per batch, and a
  session's trace opens on the trace page with its trainable tokens marked;
- on the same run sealing into a SeaweedFS bucket, beside another job under the prefix: the same, over s3://;
  then, with a trainer's cursor in the bucket, browsing every page leaves every object as it was.

Screenshots are saved under each test's tmp dir (their paths are printed).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from fixtures.cdp import BrowserPage
from fixtures.dashboard_server import Dashboard
from fixtures.local_runs import QUICKSTART, run_local
from fixtures.sealed_jobs import synthetic_traces, write_batches
from tracefleet.bucket import open_bucket
from tracefleet.traces.reader import BatchReader

TRAINABLE_BG = "rgb(216, 245, 208)"  # .smp background (#d8f5d0) in traces/render.py's page style
COUNT = "Number((document.querySelector('[data-count={0}]') || {{}}).textContent?.replace(/,/g, '') ?? -1)"
DOTS = "document.querySelectorAll('#{0} .dot').length"
PROGRESS = ("[document.querySelector('[data-progress]')?.dataset.progress ?? null, " + COUNT.format("running")
            + ", document.querySelector('[data-eta]')?.dataset.eta ?? null]")


def count(key: str) -> str:
    return COUNT.format(key)


def quickstart_job(tmp: Path, output: Path | str, tasks: int = 3) -> dict[str, Any]:
    """The quickstart, sized down: its first `tasks` tasks x 2 samples, 2 traces a batch (a batch a task)."""
    shutil.copytree(QUICKSTART, tmp, dirs_exist_ok=True)
    job = yaml.safe_load((QUICKSTART / "job.yaml").read_text())
    job["spec"]["tasks"]["inline"] = job["spec"]["tasks"]["inline"][:tasks]
    job["spec"]["tasks"]["samplesPerTask"] = 2
    job["spec"]["output"] = {"uri": str(output), "tracesPerBatch": 2}
    return job


def snapshot_bucket(client: Any, name: str) -> dict[str, tuple[str, str]]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=name)
    return {o["Key"]: (o["ETag"], str(o["LastModified"])) for p in pages for o in p.get("Contents", [])}


def test_a_local_run_shows_live_and_matches_the_reader(cpu_engine: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job = quickstart_job(tmp_path / "job", out)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    dash = Dashboard(str(out), tmp_path / "dashboard.log")  # before the run: nothing there yet
    try:
        with BrowserPage(tmp_path) as page, ThreadPoolExecutor(1) as pool:
            page.goto(dash.page("/"))
            assert page.eval("!!document.querySelector('[data-empty]')")
            page.eval("window.opened = true")  # gone if the page were reloaded
            run = pool.submit(run_local, job, tmp_path / "job", engine_url=str(cpu_engine.url), timeout_s=300)
            # the job's row appears on the open page as soon as the run writes its progress, no reload
            page.wait_for("document.querySelector('a[href^=\"/job?\"]') !== null", timeout_s=240)
            assert page.eval("Number(document.body.dataset.updates) >= 1 && window.opened === true")
            page.screenshot(shots / "overview.png")
            page.goto(dash.page("/job", path="quickstart"))
            page.eval("window.opened = true")
            seen_first = page.eval(count("batches"))
            seen = []  # (state, running, ETA) as the page shows them while the run goes on
            while not run.done():
                seen.append(page.eval(PROGRESS))
                time.sleep(0.4)
            done, _ = run.result(timeout=300)
            assert done.returncode == 0, done.stdout + done.stderr
            assert any(state == "running" and running > 0 for state, running, _ in seen), seen
            assert any(state == "running" and re.fullmatch(r"\d+ (s|min)", eta or "") for state, _, eta in seen), seen
            page.wait_for("document.querySelector('[data-progress]')?.dataset.progress === 'done'", timeout_s=30)
            assert page.eval(f"[{count('finished')}, {count('total')}, {count('running')}]") == [6, 6, 0]
            assert page.eval("document.querySelector('[data-eta]').dataset.eta") == "done"
            reader = BatchReader(str(out), "quickstart")
            manifests = reader.batches()
            traces = [t for m in manifests for t in reader.read(m).traces()]
            n = len(manifests)
            assert n == 3
            page.wait_for(f"{count('batches')} === {n} && {count('rows-read')} === {n}", timeout_s=60)
            if seen_first < n:  # the page was opened before the last batch: it came without a reload
                assert page.eval("Number(document.body.dataset.updates) >= 1 && window.opened === true")
            shown = {k: page.eval(count(k)) for k in ("sessions", "traces", "tokens", "trainable", "failed")}
            assert shown == {"sessions": len({t.meta.session_id for t in traces}), "traces": len(traces),
                             "tokens": sum(t.num_tokens for t in traces),
                             "trainable": sum(t.num_trainable for t in traces),
                             "failed": sum(m.reward.fail_closed for m in manifests)}
            assert page.eval(DOTS.format("chart-reward")) == n  # one point per batch
            assert page.eval(DOTS.format("chart-signal")) == n
            assert page.eval("document.querySelectorAll('table.sessions tr').length") == len(traces) + 1
            page.screenshot(shots / "job.png")
            # a session: its trace, opened on the trace page, trainable tokens on the highlight
            page.eval("document.querySelector('table.sessions a').click()")
            page.wait_for("location.pathname === '/session' && document.readyState === 'complete'")
            # the evaluator's part of the evidence: the tests' own output, down to pytest's summary (a patch that breaks
            # the tests' collection ends on "1 error", not on passed or failed)
            evaluator = page.eval("document.querySelector('pre.evaluator').textContent")
            assert re.search(r"\b\d+ (passed|failed|errors?)\b", evaluator), evaluator
            page.screenshot(shots / "session.png")
            page.eval("document.querySelector('table.traces a').click()")
            page.wait_for("location.pathname === '/trace' && document.readyState === 'complete'")
            marked = page.eval("[...document.querySelectorAll('.stream .smp')].map(e => getComputedStyle(e).backgroundColor)")
            trace_id = page.eval("new URLSearchParams(location.search).get('trace')")
            (trace,) = [t for t in traces if t.meta.trace_id == trace_id]
            assert marked and set(marked) == {TRAINABLE_BG} and len(marked) == trace.num_trainable
            page.screenshot(shots / "trace.png")
    finally:
        dash.close()


def test_a_bucket_run_updates_live_and_is_never_written(cpu_engine: Any, s3: Any, tmp_path: Path) -> None:
    name = s3.create_bucket()
    uri = f"s3://{name}/team"
    creds = {"endpoint_url": s3.endpoint, "access_key": s3.access_key, "secret_key": s3.secret_key}
    bucket = open_bucket(uri, **creds)
    write_batches(open_bucket(f"{uri}/other", **creds), "second", synthetic_traces(0, 4, job="second"), 4)
    job = quickstart_job(tmp_path / "job", uri, tasks=2)
    client = s3.client()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    dash = Dashboard(uri, tmp_path / "dashboard.log", env=s3.env())
    try:
        with BrowserPage(tmp_path) as page, ThreadPoolExecutor(1) as pool:
            page.goto(dash.page("/"))
            assert page.eval("document.querySelectorAll('a[href^=\"/job?\"]').length") == 1  # the other job
            run = pool.submit(run_local, job, tmp_path / "job", engine_url=str(cpu_engine.url), env=s3.env(), timeout_s=300)
            page.eval("window.opened = true")
            page.wait_for("document.querySelectorAll('a[href^=\"/job?\"]').length === 2", timeout_s=240)
            assert page.eval("window.opened === true")  # the run's first batch came without a reload
            page.goto(dash.page("/job", path="quickstart"))
            page.eval("window.opened = true")
            seen_first = page.eval(count("batches"))
            done, _ = run.result(timeout=300)
            assert done.returncode == 0, done.stdout + done.stderr
            manifests = BatchReader(bucket, "quickstart").batches()
            n = len(manifests)
            page.wait_for(f"{count('batches')} === {n} && {count('rows-read')} === {n}", timeout_s=60)
            if seen_first < n:  # the page was opened before the last batch: it came without a reload
                assert page.eval("Number(document.body.dataset.updates) >= 1 && window.opened === true")
            assert page.eval(count("sessions")) == sum(m.sessions for m in manifests) == 4
            assert page.eval(count("tokens")) == sum(m.tokens for m in manifests)
            assert page.eval(DOTS.format("chart-reward")) == n
            page.screenshot(shots / "job-s3.png")
            trainer = BatchReader(bucket, "quickstart", consumer="trainer-0")
            trainer.commit(trainer.read(1))  # a trainer that has consumed two batches
            before = snapshot_bucket(client, name)
            # every page, every link on them, and a few polls
            page.eval("document.querySelector('table.sessions a').click()")
            page.wait_for("location.pathname === '/session' && document.readyState === 'complete'")
            page.eval("document.querySelector('table.traces a').click()")
            page.wait_for("location.pathname === '/trace' && document.querySelectorAll('.smp').length > 0")
            page.goto(dash.page("/job", path="other/second"))
            page.goto(dash.page("/"))
            time.sleep(2.5)
        assert snapshot_bucket(client, name) == before
        assert json.loads(client.get_object(Bucket=name, Key="team/quickstart/consumers/trainer-0.json")["Body"].read())["next_seq"] == 2
        assert trainer.cursor() == 2
    finally:
        dash.close()
