"""The first hour's traps, as a newcomer meets them through `tracefleet run`: a harness CLI that is not installed
stops the run before any engine starts, with the setup part to run; the `command` preset's script is looked for
where the sessions run it; a rerun after a fix runs the sessions that failed before their first model call;
`--fresh` starts the job over and deletes nothing; the `traces ls` command `tracefleet run --help` suggests works
as written."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from fixtures.command_harness import MODEL_CALL  # one chat call, then exit 0: a harness that works (the fix)
from tracefleet.traces.reader import BatchReader

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "tracefleet.cli"]

def job(tmp_path: Path, name: str, harness: dict[str, Any], *, inference: dict[str, Any] | None = None,
        samples: int = 2) -> Path:
    manifest = {
        "apiVersion": "tracefleet.io/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": name},
        "spec": {
            "inference": inference or {"external": {"baseUrl": "http://127.0.0.1:1"}, "capture": {"mode": "server"}},
            "harness": {"sessionTimeoutSeconds": 60, **harness},
            "tasks": {"samplesPerTask": samples, "inline": [{"id": "t0", "prompt": "say hi"}]},
            "output": {"uri": str(tmp_path / "out"), "tracesPerBatch": samples},
            "maxRetries": 0,
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def run(job_path: Path, *extra: str, env: dict[str, str] | None = None, timeout: float = 300
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "run", str(job_path), "--work-dir", str(job_path.parent / "work"), *extra],
                          capture_output=True, text=True, timeout=timeout, cwd=job_path.parent,
                          env={**os.environ, "TRACEFLEET_SPOOL": str(job_path.parent / "spool"), **(env or {})})


def rows(out: Path, name: str) -> list[dict[str, Any]]:
    found = []
    for data in sorted((out / name / "batches").glob("*/*.parquet")):
        found += pq.read_table(data, columns=["session_id", "sample_index", "num_tokens", "fail_closed_reasons"],
                               use_threads=False).to_pylist()
    return found


def test_a_missing_harness_cli_stops_the_run_before_the_engine_starts(tmp_path: Path) -> None:
    # the CPU engine would start for this job; a Pi CLI is nowhere: not in an empty cache, not on PATH
    path = job(tmp_path, "no-cli", {"preset": "pi"}, inference={"managed": {"model": "smollm2"}})
    started = time.monotonic()
    done = run(path, env={"TRACEFLEET_CACHE": str(tmp_path / "cache"), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("tracefleet run: spec.harness.preset: pi needs its CLI (@mariozechner/pi-coding-agent@"), line
    assert "run `bash hack/setup.d/50-harnesses.sh`" in line, line
    assert not (tmp_path / "work" / "engine.log").exists()  # no engine was started
    assert time.monotonic() - started < 60


def test_the_command_presets_script_is_looked_for_where_sessions_run_it(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text("print('hi')\n")
    path = job(tmp_path, "relative-agent", {"preset": "command", "command": ["python", "agent.py", "{prompt}"]})
    done = run(path)
    assert done.returncode == 2  # the job file's mistake, as `tracefleet validate` reports it
    assert done.stderr.strip() == (
        f"tracefleet run: {path}: spec.harness.command: the script 'agent.py' is not in every session's working "
        "directory (a session runs in its task's workspace); the file next to the job file is `{job_dir}/agent.py`"), done.stderr


def test_rerun_after_a_fix_runs_what_failed_before_a_model_call_and_fresh_starts_over(
        scripted_engine: Any, tmp_path: Path) -> None:
    url = scripted_engine.url
    # 1. the harness dies before it calls the model: both sessions are sealed fail-closed, without a token
    path = job(tmp_path, "rerun", {"preset": "command", "command": ["sh", "-c", "exit 3"]})
    first = run(path, "--engine-url", url)
    assert first.returncode == 1, first.stdout + first.stderr
    sealed = rows(tmp_path / "out", "rerun")
    assert len(sealed) == 2 and all(r["num_tokens"] == 0 and r["fail_closed_reasons"] for r in sealed), sealed
    # 2. fixed: the rerun runs those two sessions again, and they call the model
    (tmp_path / "harness.py").write_text(MODEL_CALL)
    path = job(tmp_path, "rerun", {"preset": "command", "command": ["python", "{job_dir}/harness.py"]})
    second = run(path, "--engine-url", url)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "2 sealed session(s) of job 'rerun' failed before their first model call (an infrastructure failure): " \
           "running them again" in second.stderr, second.stderr
    assert "sessions       2 run now, 0 already sealed earlier, 2 in the job" in second.stdout, second.stdout
    # the job's sessions, once each: the rows the first run sealed for them count no more
    assert "judged 2, quarantined 0, dropped 0" in second.stdout and "the infrastructure's 0" in second.stdout, \
        second.stdout
    assert sorted(r["sample_index"] for r in rows(tmp_path / "out", "rerun") if r["num_tokens"]) == [0, 1]
    # as a trainer reads them: each session once, its newest rows (the earlier row without a token is not read)
    reader = BatchReader(str(tmp_path / "out"), "rerun")
    read = [(seq, r) for seq in reader.seqs() for r in reader.read(seq).table.to_pylist()]
    assert sorted((seq, r["session_id"]) for seq, r in read) == [(1, "rerun-s0"), (1, "rerun-s1")]
    assert all(r["num_tokens"] for _, r in read) and reader.read(0).manifest.sessions == 0
    # 3. nothing left to run: it says so, and how to start over
    third = run(path, "--engine-url", url)
    assert third.returncode == 0 and "nothing to run (`--fresh` runs them all again" in third.stderr, third.stderr
    # 4. --fresh runs every session again, and the sealed batches stay as they were
    batches = tmp_path / "out" / "rerun" / "batches"
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in batches.rglob("*") if p.is_file()}
    fresh = run(path, "--engine-url", url, "--fresh")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert "--fresh: every session of job 'rerun' runs again; its 2 sealed batch(es)" in fresh.stderr, fresh.stderr
    assert "sessions       2 run now" in fresh.stdout
    assert all(p.exists() and hashlib.sha256(p.read_bytes()).hexdigest() == h for p, h in before.items())
    assert len([p for p in batches.iterdir() if (p / "manifest.json").exists()]) == 3
    # the inspect command `tracefleet run --help` suggests, as written (OUTPUT and JOB filled in)
    helptext = subprocess.run([*CLI, "run", "--help"], capture_output=True, text=True, timeout=60).stdout
    (suggested,) = re.findall(r"`(tracefleet traces ls [^`]+)`", " ".join(helptext.split()))
    command = suggested.replace("OUTPUT", str(tmp_path / "out")).replace("JOB", "rerun").split()
    listing = subprocess.run([*CLI, *command[1:]], capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0 and len(re.findall(r"^\s+\d+\s+\d+\s+\d+", listing.stdout, re.M)) == 3, listing


def test_preflight_judges_the_command_where_it_runs(tmp_path: Path) -> None:
    from tracefleet.runner.preflight import harness_problems

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "agent.py").write_text("")
    # in every task's workspace: fine; a task without one (None) lacks it
    assert harness_problems("command", ["python", "agent.py"], [repo], tmp_path) == []
    assert harness_problems("command", ["python", "agent.py"], [repo, None], tmp_path)
    # {job_dir} and absolute paths are checked as they are; options and placeholders are not files
    assert harness_problems("command", ["python", "{job_dir}/repo/agent.py"], [None], tmp_path) == []
    assert harness_problems("command", ["python", "-m", "http.server"], [None], tmp_path) == []
    assert harness_problems("command", ["python", "{workdir}/x.py"], [None], tmp_path) == []
    assert harness_problems("command", ["/nowhere/agent"], [None], tmp_path) == ["spec.harness.command: /nowhere/agent: no such file"]
    assert harness_problems("command", ["no-such-program-here"], [None], tmp_path) == [
        "spec.harness.command: 'no-such-program-here' is not on PATH"]
