"""A run that stopped never looks alive, in real headless Chromium: three `tracefleet run`s into one folder (a
command harness, the scripted engine), one killed with SIGKILL (its driver gone: "stopped"), one interrupted by
Ctrl-C ("interrupted (n never started)"), one frozen with SIGSTOP (alive, not writing: "stale since ..."), beside
a training loop whose loop.jsonl holds a malformed line and an `Infinity` figure: the page shows each as such on
its own row, without a reload, and its relative times tick between refreshes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from fixtures.cdp import BrowserPage
from fixtures.command_harness import MODEL_CALL
from fixtures.dashboard_server import Dashboard
from fixtures.local_runs import CALC
from fixtures.sealed_jobs import synthetic_traces, write_batches
from tracefleet.bucket import open_bucket
from tracefleet.contract.layout import progress_key
from tracefleet.contract.progress import JobProgress

STATE = "(document.querySelector('tr:has(a[href=\"/job?path={0}\"]) [data-state]')?.dataset.state ?? null)"
STATE_WORDS = "document.querySelector('tr:has(a[href=\"/job?path={0}\"]) [data-state]')?.textContent ?? null"


def start_run(tmp: Path, name: str, engine_url: str, out: Path, where: str = "") -> subprocess.Popen[str]:
    """`tracefleet run` of job `name` (in tmp/`where`, default its name): 8 sessions, one at a time, each a model call
    then 3 s of work."""
    folder = tmp / (where or name)
    folder.mkdir()
    (folder / "harness.py").write_text(MODEL_CALL + "\nimport time\ntime.sleep(3)\n")
    job = {"apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": name}, "spec": {
        "inference": {"external": {"baseUrl": "http://127.0.0.1:1"}, "capture": {"mode": "server"}},
        "harness": {"preset": "command", "command": ["python", "{job_dir}/harness.py"], "sessionTimeoutSeconds": 60},
        "tasks": {"samplesPerTask": 2, "inline": [{"id": f"t{i}", "prompt": f"task {i}", "workspace": {"repo": str(CALC)}}
                                                  for i in range(4)]},
        "evaluator": {"preset": "command", "timeoutSeconds": 30, "command": ["true"]},
        "output": {"uri": str(out), "tracesPerBatch": 2}, "parallelism": 1}}
    (folder / "job.yaml").write_text(yaml.safe_dump(job))
    return subprocess.Popen(
        [sys.executable, "-m", "tracefleet.cli", "run", str(folder / "job.yaml"), "--engine-url", engine_url,
         "--work-dir", str(folder / "work")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=folder,
        env={**os.environ, "TRACEFLEET_SPOOL": str(folder / "spool")}, start_new_session=True)


def progress_of(out: Path, job: str) -> JobProgress | None:
    path = out / progress_key(job)
    return JobProgress.model_validate_json(path.read_bytes()) if path.exists() else None


def wait_until(check: Any, what: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.2)


def test_killed_interrupted_and_stale_runs_and_a_bad_loop_log(scripted_engine: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = out / "runs" / "bad-loop"  # a training loop whose loop.jsonl went wrong, beside the jobs
    write_batches(open_bucket(run / "batches"), "train", synthetic_traces(0, 8, job="train"), 4)
    steps = [{"step": 1, "reward_mean": 0.25, "loss": 0.5}, {"step": 2, "reward_mean": float("inf"), "loss": 0.4},
             {"step": 3, "reward_mean": 0.5, "loss": "n/a"}]
    (run / "loop.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps) + "{not json\n[1, 2]\n")
    runs = {name: start_run(tmp_path, name, str(scripted_engine.url), out) for name in ("killed", "interrupted", "frozen")}
    dash = Dashboard(str(out), tmp_path / "dashboard.log")
    try:
        for name, proc in runs.items():  # each is under way: it has finished a session and wrote so
            wait_until(lambda: proc.poll() is None and (p := progress_of(out, name)) is not None and p.counters.finished >= 1,
                       f"{name} to finish a session")
        runs["killed"].send_signal(signal.SIGKILL)
        runs["interrupted"].send_signal(signal.SIGINT)
        runs["frozen"].send_signal(signal.SIGSTOP)
        runs["killed"].wait(30)
        output, _ = runs["interrupted"].communicate(timeout=120)
        assert runs["interrupted"].returncode == 130, output
        interrupted = progress_of(out, "interrupted")
        assert interrupted and interrupted.finished and interrupted.interrupted and interrupted.counters.pending > 0
        assert f"(interrupted: {interrupted.counters.pending} never started)" in output
        with BrowserPage(tmp_path) as page:
            page.goto(dash.page("/"))
            page.eval("window.opened = true")
            page.wait_for(f"{STATE.format('killed')} === 'stopped'", timeout_s=30)
            assert page.eval(STATE_WORDS.format("interrupted")) == f"interrupted ({interrupted.counters.pending} never started)"
            # the frozen driver is alive and not writing: stale after 3 heartbeats of 5 s, no reload
            page.wait_for(f"{STATE.format('frozen')} === 'stale'", timeout_s=45)
            assert page.eval("window.opened === true && Number(document.body.dataset.updates) >= 1")
            frozen = progress_of(out, "frozen")
            assert frozen is not None and not frozen.finished
            assert page.eval(STATE_WORDS.format("frozen")) == f"stale since {frozen.updated_at:%Y-%m-%d %H:%M:%S} UTC"
            assert page.eval("[...document.querySelectorAll('[data-eta]')].map(e => e.dataset.eta).sort()") == [
                "interrupted", "stale", "stopped"]
            # the loop: its good steps plotted, its bad lines said on its row; the healthy jobs beside it unharmed
            assert "2 line(s) of loop.jsonl unreadable" in page.eval("document.querySelector('[data-bad-lines]').textContent")
            page.screenshot(tmp_path / "overview.png")
            page.goto(dash.page("/loop", path="runs/bad-loop"))
            assert page.eval("document.querySelectorAll('#chart-reward_mean .dot').length") == 2  # 0.25, 0.5: not inf
            assert page.eval("document.querySelectorAll('#chart-loss .dot').length") == 2  # 0.5, 0.4: not "n/a"
            assert page.eval("document.querySelector('[data-bad-lines]').dataset.badLines") == "2"
            # a killed job's page: stopped, nothing running, and its "last written" keeps ticking between refreshes
            page.goto(dash.page("/job", path="killed"))
            assert page.eval("document.querySelector('[data-progress]').dataset.progress") == "stopped"
            assert page.eval("document.querySelector('[data-count=running]').textContent") == "0"
            updates = page.eval("document.body.dataset.updates ?? '0'")
            ago = "document.querySelector('[data-progress] [data-ago]:last-of-type').textContent"
            first = page.eval(ago)
            page.wait_for(f"{ago} !== {json.dumps(first)}", timeout_s=5)
            assert page.eval("document.body.dataset.updates ?? '0'") == updates  # the clock, not a refresh
            page.screenshot(tmp_path / "killed.png")
        # run again, the killed job's run says what became of the last one before it continues it
        again = start_run(tmp_path, "killed", str(scripted_engine.url), out, where="killed-again")
        runs["again"] = again
        assert again.stdout is not None
        said = ""
        while "did not finish" not in said and len(said.splitlines()) < 10:
            said += again.stdout.readline()
        assert "the last run of job 'killed' did not finish (its process is gone; last written" in said, said
    finally:
        dash.close()
        for proc in runs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
