"""The README's main job, run as a new user runs it: `tracefleet run examples/quickstart/job.yaml` starts
the real CPU engine (Gemma 3 270M on llama.cpp), the proxy, the example agent and the tests evaluator,
and leaves batches the trainer reader can read, with trainable tokens and the evaluator's rewards."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tracefleet.traces.reader import BatchReader

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quickstart_produces_a_readable_batch(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tracefleet.cli", "run", str(REPO / "examples" / "quickstart" / "job.yaml"),
         "--work-dir", str(tmp_path / "work")],
        cwd=tmp_path, capture_output=True, text=True, timeout=840,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "status         completed 6" in output, output
    # capture mode auto (the default) picks exact for Gemma 3 and says so
    assert "capture mode exact (the model's family is supported)" in output, output
    reader = BatchReader(tmp_path / "tracefleet-output", "quickstart")
    batches = [reader.read(seq) for seq in reader.seqs()]
    traces = [t for b in batches for t in b.traces()]
    assert batches and traces
    assert sum(t.num_trainable for t in traces) > 0
    sessions = {t.meta.session_id for t in traces}
    # Exact capture: the example agent only appends to its history, so every session's
    # calls extend each other token for token and merge into one trace.
    assert len(traces) == len(sessions), [t.call_ids for t in traces]
    assert len(sessions) == 6 and {t.meta.task_id for t in traces} == {"calc-add", "textutil-shout", "inventory-total"}
    # Every session was judged by the tests evaluator: a reward (0 or 1), no fail-closed marks.
    assert all(t.meta.reward in (0.0, 1.0) and t.meta.outcome == "ok" for t in traces)
    assert all(t.meta.model == "gemma3-270m" for t in traces)
    inspect = f"tracefleet traces ls {tmp_path / 'tracefleet-output'} --job quickstart"
    assert inspect in output
    listing = subprocess.run([sys.executable, "-m", "tracefleet.cli", *inspect.split()[1:]],
                             capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0 and re.search(r"^\s+0\s+\d+\s+\d+", listing.stdout, re.M), listing
