"""`tracefleet traces ls|show|export|flush` as a user runs it (subprocess), on a directory and on S3."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from tracefleet.bucket import LocalBucket, S3Bucket
from tracefleet.traces import Sealer, SessionInfo, build_traces
from tracefleet.traces.synthetic import SyntheticSession


def tracefleet(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tracefleet", "traces", *argv],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )


def _session(tmp: Path) -> Path:
    path = tmp / "sess-cli.jsonl"
    s = SyntheticSession(path, "sess-cli")
    a = s.call(s.tokens(200), 6)
    s.call(s.extend(a, s.tokens(4)), 6, parent=a, policy_version=3)
    s.close()
    return path


def test_cli_on_directory_and_capture_log(tmp_path: Path) -> None:
    log = _session(tmp_path)
    result = build_traces(log, session=SessionInfo(job="job-a", reward=1.0, group_id="g"))
    Sealer(LocalBucket(tmp_path / "bucket"), "job-a", spool=tmp_path / "spool").seal(result.traces)

    ls = tracefleet("ls", str(tmp_path / "bucket"))
    assert ls.returncode == 0 and "job-a\t1 batches" in ls.stdout
    ls = tracefleet("ls", str(tmp_path / "bucket"), "--job", "job-a")
    assert ls.returncode == 0 and ls.stdout.splitlines()[1].split()[:3] == ["0", "1", "1"]

    html = tmp_path / "t.html"
    show = tracefleet("show", str(tmp_path / "bucket"), "--color", "always", "--html", str(html))
    assert show.returncode == 0, show.stderr
    trace = result.traces[0]
    assert "policy v3" in show.stdout and "12 trainable" in show.stdout and "context tokens" in show.stdout
    first_sampled = " ".join(str(i) for i in trace.tokens[trace.spans[0].completion_start : trace.spans[0].completion_end])
    assert f"\x1b[32m{first_sampled} \x1b[0m" in show.stdout  # sampled tokens in green
    page = html.read_text()
    assert page.startswith("<!doctype html>") and page.count('class="smp"') == 12 and "<script" not in page

    direct = tracefleet("show", str(log), "--builder", "per-request", "--trace", "1", "--color", "never")
    assert direct.returncode == 0 and "trace 2 of 2" in direct.stdout

    out = tmp_path / "x.jsonl"
    exp = tracefleet("export", str(tmp_path / "bucket"), "--job", "job-a", "--out", str(out))
    assert exp.returncode == 0, exp.stderr
    row = json.loads(out.read_text().splitlines()[0])
    assert row["tokens"] == trace.tokens.tolist() and row["logprobs"][0] is None and row["meta"]["reward"] == 1.0
    pq_out = tmp_path / "x.parquet"
    assert tracefleet("export", str(log), "--format", "parquet", "--out", str(pq_out)).returncode == 0
    assert pq.read_table(pq_out, use_threads=False).num_rows == 1

    missing = tracefleet("ls", str(tmp_path / "nope"))  # a wrong name is a usage mistake: status 2
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    helptext = subprocess.run([sys.executable, "-m", "tracefleet", "traces", "--help"], capture_output=True, text=True, timeout=60)
    assert "examples:" in helptext.stdout and "show" in helptext.stdout


def test_cli_on_s3_with_env_credentials(s3, tmp_path: Path) -> None:  # noqa: ANN001
    name = s3.create_bucket()
    result = build_traces(_session(tmp_path), session=SessionInfo(job="job-s3", reward=0.0))
    Sealer(S3Bucket(name, "runs", **s3.bucket_options()), "job-s3", spool=tmp_path / "spool").seal(result.traces)
    env = s3.env()
    ls = tracefleet("ls", f"s3://{name}/runs", "--job", "job-s3", "--json", env=env)
    assert ls.returncode == 0, ls.stderr
    assert json.loads(ls.stdout)[0]["traces"] == 1
    show = tracefleet("show", f"s3://{name}/runs", "--color", "never", env=env)
    assert show.returncode == 0 and "job-s3 / sess-cli" in show.stdout
    bad = tracefleet("ls", "s3://no-such-bucket-cli/runs", "--job", "x", env=env)
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_ls_on_a_capture_log_lists_the_traces_it_builds(tmp_path: Path) -> None:
    """The help says URI may be a capture log: `ls` lists the traces it builds into (not "no bucket")."""
    log = _session(tmp_path)
    ls = tracefleet("ls", str(log))
    assert ls.returncode == 0, ls.stderr
    header, row = ls.stdout.splitlines()
    assert header.split()[:4] == ["trace", "calls", "tokens", "trainable"]
    assert row.split()[:4] == ["0", "2", "216", "12"] and row.endswith("sess-cli:0000")
    per_call = tracefleet("ls", str(log), "--builder", "per-request")
    assert per_call.returncode == 0 and len(per_call.stdout.splitlines()) == 3


def test_ls_and_show_say_whose_outcome_each_session_is(tmp_path: Path) -> None:
    """The infrastructure's (an evaluator that could not run), the policy's (a harness that timed out after the
    model answered) and ok sessions, by kind in `ls`, row by row in `ls --batch`, in `show`'s header."""
    traces = []
    for sid, info in (("s0", {"evaluator_status": "unavailable"}), ("s1", {"failure": "session_timeout:harness"}),
                      ("s2", {})):
        (tmp_path / sid).mkdir()
        traces += build_traces(_session(tmp_path / sid), session=SessionInfo(job="kinds", session_id=sid, group_id="g",
                                                                       reward=0.0, **info)).traces
    Sealer(LocalBucket(tmp_path / "bucket"), "kinds", spool=tmp_path / "spool").seal(traces)
    bucket = str(tmp_path / "bucket")

    ls = tracefleet("ls", bucket, "--job", "kinds")
    header, row = ls.stdout.splitlines()
    assert header.split()[8:11] == ["ok", "policy's", "infrastructure's"] and row.split()[7:10] == ["1", "1", "1"]
    rows = tracefleet("ls", bucket, "--job", "kinds", "--batch", "0").stdout.splitlines()[1:]
    assert len(rows) == 3
    for line, (words, session) in zip(rows, [("the infrastructure's", "s0"), ("the policy's", "s1"), ("ok", "s2")]):
        assert re.search(rf"\s{re.escape(words)}\s+{session} / {session}:", line), line
    show = tracefleet("show", bucket, "--job", "kinds", "--trace", "0", "--color", "never")
    assert ("outcome" in show.stdout and "the infrastructure's (left out of the group statistics and the loss): "
            "fail_closed (evaluator_unavailable)" in show.stdout), show.stdout
    assert "the policy's (reward <= 0, trained on)" in tracefleet("show", bucket, "--trace", "1", "--color", "never").stdout
