"""Each span says what kind its logprobs are (from its capture record), and a trainer is not handed raw logprobs
(vLLM's default --logprobs-mode: before temperature/top-k/top-p) as behaviour logprobs unless it asks: the reader
raises one clear error, the GRPO example exits with one line; told, both go on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tracefleet.bucket import open_bucket
from tracefleet.traces import BatchReader, RawLogprobs, Sealer, SessionInfo, build_traces
from tracefleet.traces.synthetic import SyntheticSession

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo" / "train_step.py"


def seal(tmp_path: Path, job: str, modes: list[str | None]) -> str:
    bucket = tmp_path / "bucket"
    traces = []
    for i, mode in enumerate(modes):
        sid = f"{job}-{i}"
        with SyntheticSession(tmp_path / f"{sid}.jsonl", sid, seed=i, vocab=256) as s:
            extra = {"logprobs_mode": mode} if mode else {}
            first = s.call(s.tokens(12), 6, **extra)
            s.call(s.extend(first, s.tokens(4)), 6, parent=first, **extra)
        info = SessionInfo(job=job, session_id=sid, task_id="t", group_id="t", sample_index=i, reward=float(i % 2))
        traces += build_traces(tmp_path / f"{sid}.jsonl", session=info).traces
    Sealer(open_bucket(str(bucket)), job, spool=tmp_path / f"spool-{job}").seal(traces)
    return str(bucket)


def test_spans_carry_the_kind_and_the_reader_refuses_raw_ones(tmp_path: Path) -> None:
    bucket = seal(tmp_path, "mixed", ["processed_logprobs", "raw_logprobs", None])
    batch = BatchReader(bucket, "mixed").read(0)
    assert [[s.logprobs_mode for s in t.spans] for t in batch.traces()] == [
        ["processed_logprobs"] * 2, ["raw_logprobs"] * 2, [None] * 2]
    with pytest.raises(RawLogprobs) as err:
        batch.tensors()
    assert "\n" not in str(err.value) and str(err.value).startswith("2 of 6 spans hold raw logprobs")
    assert batch.tensors(allow_raw_logprobs=True)["old_logprobs"].shape[0] == 3
    fine = BatchReader(seal(tmp_path, "fine", ["processed_logprobs", None]), "fine").read(0)
    assert fine.tensors()["input_ids"].shape[0] == 2  # processed, and records from before the kind was recorded


def test_grpo_example_refuses_raw_logprobs_unless_told(tmp_path: Path) -> None:
    bucket = seal(tmp_path, "raw", ["raw_logprobs", "raw_logprobs"])
    run = [sys.executable, str(EXAMPLE), "--bucket", bucket, "--job", "raw", "--consumer", "c"]
    refused = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr[-2000:]
    assert "raw logprobs" in refused.stderr and "--allow-raw-logprobs" in refused.stderr
    told = subprocess.run([*run, "--allow-raw-logprobs"], capture_output=True, text=True, timeout=300)
    assert told.returncode == 0, told.stderr[-2000:]
