"""The README's second example, run as a user runs it: `tracefleet run examples/real-harness/job.yaml`
drives a real harness CLI (Pi) against the real CPU model (SmolLM2 on llama.cpp) through the proxy. The
model is too small to solve the task; what the test checks is what the example promises: every call the
harness made was answered (no engine error, no max_tokens refusal), captured, and sealed into batches
the trainer reads, with trainable tokens."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.harnesses import harness_binary_path
from tracefleet.contract.capture import read_capture_log
from tracefleet.traces.reader import BatchReader

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_real_harness_example_answers_every_call_and_seals_batches(tmp_path: Path) -> None:
    harness_binary_path("pi")  # fails with the install command when setup has not installed it
    example = tmp_path / "real-harness"
    shutil.copytree(REPO / "examples" / "real-harness", example)  # as shipped: 1 task x 2 samples
    done = subprocess.run(
        [sys.executable, "-m", "tracefleet.cli", "run", str(example / "job.yaml"), "--work-dir", str(tmp_path / "work")],
        cwd=tmp_path, capture_output=True, text=True, timeout=400,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "context 2048" in output and "capture mode exact (the model's family is supported)" in output, output
    assert "status         completed 2" in output and "FAILED" not in output, output
    # Every call Pi made reached the model and was answered: no engine refusal, nothing cut off.
    records = [r for log in sorted((tmp_path / "work" / "capture").rglob("*.jsonl")) for r in read_capture_log(log).records]
    assert records and all(r.status == "ok" and r.error is None for r in records), [r.error for r in records]
    assert all(len(r.prompt_ids) > 1000 and r.completion_ids for r in records)  # Pi's real prompt, a real answer
    reader = BatchReader(tmp_path / "tracefleet-output", "real-harness")
    traces = [t for seq in reader.seqs() for t in reader.read(seq).traces()]
    assert {t.meta.session_id for t in traces} == {r.session_id for r in records}
    assert all(t.meta.harness == "pi" and t.meta.model == "smollm2" for t in traces)
    assert sum(t.num_trainable for t in traces) > 0
