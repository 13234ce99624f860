"""`tracefleet run` in local mode, as a subprocess the way a user runs it: batches sealed, progress and
summary printed, Ctrl-C (SIGINT) mid-run leaves sealed batches intact and a rerun completes without
duplicates, `--accept` keeps only accepted sessions."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from tracefleet.contract.capture import read_capture_log

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"
MARK = "tracefleet-local-test-harness"

HARNESS = textwrap.dedent(
    f"""
    # {MARK}
    import json, os, sys, time, urllib.request
    req = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({{"model": os.environ["OPENAI_MODEL"], "max_tokens": 8,
                          "messages": [{{"role": "user", "content": os.environ["TRACEFLEET_PROMPT"]}}]}}).encode(),
        headers={{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}},
    )
    json.load(urllib.request.urlopen(req, timeout=60))
    time.sleep(float(sys.argv[1]))
    """
)


def write_job(tmp_path: Path, *, name: str, tasks: int, samples: int, parallelism: int, sleep_s: float,
              per_batch: int = 1, sampling: dict[str, Any] | None = None) -> Path:
    (tmp_path / "harness.py").write_text(HARNESS)
    job = {
        "apiVersion": "tracefleet.io/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": name},
        "spec": {
            "inference": {"external": {"baseUrl": "http://127.0.0.1:1"}, "capture": {"mode": "server"},
                          **({"sampling": sampling} if sampling else {})},
            "harness": {"preset": "command", "command": ["python", "{job_dir}/harness.py", str(sleep_s)],
                        "sessionTimeoutSeconds": 120},
            "tasks": {
                "samplesPerTask": samples,
                "inline": [{"id": f"t{i}", "prompt": f"task {i}", "workspace": {"repo": str(QUICKSTART / "tasks" / "calc")}}
                           for i in range(tasks)],
            },
            # reward 1 for even task ids, 0 for odd ones (exit code)
            "evaluator": {"preset": "command", "timeoutSeconds": 60,
                          "command": ["sh", "-c", 'case "$TRACEFLEET_TASK_ID" in *[02468]) exit 0;; *) exit 1;; esac']},
            "output": {"uri": str(tmp_path / "out"), "tracesPerBatch": per_batch},
            "parallelism": parallelism,
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def tracefleet_run(job: Path, engine_url: str, tmp_path: Path, *extra: str, env: dict[str, str] | None = None
                   ) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tracefleet.cli", "run", str(job), "--engine-url", engine_url,
         "--work-dir", str(tmp_path / "work"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={**os.environ, "TRACEFLEET_SPOOL": str(tmp_path / "spool"), **(env or {})},
    )


def sealed_rows(out: Path, job: str) -> list[dict[str, Any]]:
    """Every trace row of every sealed batch, after checking each batch against its manifest."""
    rows: list[dict[str, Any]] = []
    root = out / job / "batches"
    for batch in sorted(root.iterdir()) if root.exists() else []:
        manifest_path = batch / "manifest.json"
        if not manifest_path.exists():
            continue  # not a batch (a reader never sees it)
        manifest = json.loads(manifest_path.read_text())
        for obj in manifest["objects"]:
            data = (batch / obj["name"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == obj["sha256"] and len(data) == obj["size"]
            table = pq.read_table(batch / obj["name"], columns=["task_id", "sample_index", "session_id", "reward", "num_trainable"],
                                  use_threads=False)
            assert table.num_rows == obj["rows"]
            rows += table.to_pylist()
    return rows


def harness_processes() -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if MARK in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


def engine_url_of(engine: Any) -> str:
    return str(getattr(engine, "url", engine))


def test_local_run_seals_batches_with_rewards(scripted_engine: Any, tmp_path: Path) -> None:
    # the job's sampling replaces the harness's (it sends none) on every call
    job = write_job(tmp_path, name="local-basic", tasks=2, samples=2, parallelism=2, sleep_s=0, per_batch=3,
                    sampling={"temperature": 0.6})
    # the engine's logprobs kind and a time limit stated on the command line (an external engine says neither)
    proc = tracefleet_run(job, engine_url_of(scripted_engine), tmp_path, "--logprobs-mode", "processed_logprobs",
                          "--engine-inter-token-timeout-s", "90")
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    rows = sealed_rows(tmp_path / "out", "local-basic")
    assert sorted((r["task_id"], r["sample_index"]) for r in rows) == [("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)]
    assert {r["task_id"]: r["reward"] for r in rows} == {"t0": 1.0, "t1": 0.0}
    assert all(r["num_trainable"] > 0 for r in rows)
    assert "mean reward    0.500" in output and "inspect: tracefleet traces ls" in output
    # --engine-url: the harness was given the name the engine serves (read from its /v1/models), not `default`
    records = [r for log in (tmp_path / "work" / "capture").rglob("*.jsonl") for r in read_capture_log(log).records]
    assert {r.requested_model for r in records} == {scripted_engine.model}
    assert {r.logprobs_mode for r in records} == {"processed_logprobs"}
    assert all(r.sampling["temperature"] == {"value": 0.6, "source": "job"} for r in records)
    spans = [span for batch in (tmp_path / "out" / "local-basic" / "batches").glob("*/*.parquet")
             for row in pq.read_table(batch, columns=["spans"]).to_pylist() for span in row["spans"]]
    assert spans and {(span["temperature"], span["top_p"]) for span in spans} == {(0.6, None)}


def test_sigint_keeps_sealed_batches_and_rerun_completes_without_duplicates(scripted_engine: Any, tmp_path: Path) -> None:
    job = write_job(tmp_path, name="local-sigint", tasks=5, samples=2, parallelism=2, sleep_s=2)
    proc = tracefleet_run(job, engine_url_of(scripted_engine), tmp_path)
    batches = tmp_path / "out" / "local-sigint" / "batches"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list(batches.glob("*/manifest.json"))) < 2:
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    assert "stopping" in output and "continue: tracefleet run" in output
    first = sealed_rows(tmp_path / "out", "local-sigint")
    assert 2 <= len(first) < 10
    assert harness_processes() == []  # the running sessions' process groups were killed

    rerun = tracefleet_run(job, engine_url_of(scripted_engine), tmp_path)
    output, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, output
    assert f"{len(first)} of 10 sessions are already in sealed batches" in output
    rows = sealed_rows(tmp_path / "out", "local-sigint")
    keys = [(r["task_id"], r["sample_index"]) for r in rows]
    assert len(keys) == len(set(keys)) == 10
    assert [r for r in rows if r in first] == first  # the first run's batches are untouched


def test_accept_keeps_only_accepted_sessions(scripted_engine: Any, tmp_path: Path) -> None:
    job = write_job(tmp_path, name="local-accept", tasks=4, samples=1, parallelism=2, sleep_s=0)
    proc = tracefleet_run(job, engine_url_of(scripted_engine), tmp_path, "--accept", "reward>=1")
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    rows = sealed_rows(tmp_path / "out", "local-accept")
    assert sorted(r["task_id"] for r in rows) == ["t0", "t2"] and all(r["reward"] == 1.0 for r in rows)
    assert re.search(r"accepted\s+2/4 sessions \(reward>=1\)", output), output


def test_bucket_down_keeps_the_data_and_a_rerun_uploads_it(scripted_engine: Any, s3_private: Any, tmp_path: Path) -> None:
    bucket = s3_private.create_bucket()
    job = write_job(tmp_path, name="local-s3", tasks=2, samples=2, parallelism=2, sleep_s=3)
    uri = f"s3://{bucket}/rollouts"
    env = {**s3_private.env(), "AWS_MAX_ATTEMPTS": "2"}
    proc = tracefleet_run(job, engine_url_of(scripted_engine), tmp_path, "--output", uri, env=env)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # the bucket answered the start-up listing; now take it down
        lines.append(line)
        if "4 sessions, parallelism" in line:
            s3_private.stop()
            break
    output = "".join(lines) + proc.communicate(timeout=300)[0]
    assert proc.returncode == 1, output
    assert "status         completed 4" in output and "NOT SEALED" in output, output
    spooled = list((tmp_path / "spool").rglob("manifest.json"))
    assert spooled, output  # the traces wait on local disk

    s3_private.start()
    rerun = tracefleet_run(job, engine_url_of(scripted_engine), tmp_path, "--output", uri, env=env)
    output, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, output
    assert "all 4 sessions of job 'local-s3' are already in sealed batches" in output, output
    from tracefleet.traces.reader import BatchReader
    from tracefleet.bucket import open_bucket

    reader = BatchReader(open_bucket(uri, **s3_private.bucket_options()), "local-s3")
    keys = [(t.meta.task_id, t.meta.sample_index) for seq in reader.seqs() for t in reader.read(seq).traces()]
    assert sorted(keys) == [("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)]


WHERE_HARNESS = HARNESS + textwrap.dedent(
    """
    print(os.getcwd(), os.environ.get("PWD"), sorted(os.listdir(".")))
    open("made.txt", "w").write("made here")
    """
)


def test_the_harness_starts_in_the_jobs_workdir(scripted_engine: Any, tmp_path: Path) -> None:
    """spec.harness.workspace.workdir is where the harness starts, as in a pod (operator.children.harness): the
    session's own copy of the workspace bound there, the same path in every session; what it writes there is
    the session's change, which the evaluator sees."""
    job = write_job(tmp_path, name="local-workdir", tasks=1, samples=2, parallelism=2, sleep_s=0, per_batch=2)
    (tmp_path / "harness.py").write_text(WHERE_HARNESS)
    manifest = yaml.safe_load(job.read_text())
    manifest["spec"]["harness"]["workspace"] = {"workdir": "/tracefleet-task"}
    manifest["spec"]["evaluator"]["command"] = ["sh", "-c", 'test "$(cat made.txt)" = "made here"']
    job.write_text(yaml.safe_dump(manifest))
    proc = tracefleet_run(job, engine_url_of(scripted_engine), tmp_path)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    seen = [out.read_text().split(" ", 2) for out in (tmp_path / "work").rglob("harness.stdout")]
    assert len(seen) == 2, output
    listing = repr(sorted([".git", *(p.name for p in (QUICKSTART / "tasks" / "calc").iterdir())]))
    assert all(s[:2] == ["/tracefleet-task"] * 2 and s[2].strip() == listing for s in seen), seen
    assert [r["reward"] for r in sealed_rows(tmp_path / "out", "local-workdir")] == [1.0, 1.0]
    assert not Path("/tracefleet-task").exists()  # made in the session's view, not on this machine
