"""Diagnostics cost per session and backtest throughput.

    .venv/bin/python bench/diagnostics.py [--sessions 1000] [--calls 8]

1. Evidence + diagnostics: for each session, `session_evidence` over a capture log of `--calls` calls
   (200-token prompts; each but the last a 40-token completion with a sentence of text and one shell
   tool call, in turn a read, an edit and a test run; the last a 400-token final summary, so the
   repetition check of `runaway_output` reads it) and a 3-file, 40-line patch, then every built-in
   (`run_diagnostics`, the default set). Reports ms/session for each step.
2. Backtest: the sessions sealed as one job (groups of 4, one batch per 64 sessions) with their evidence
   in a local bucket, then `backtest` with every built-in. Reports sessions/s.
3. Reader cost with overlays: every batch read by a BatchReader without overlays, with overlays but
   none written, and with one overlay quarantining every other session (the verdicts of a diagnostic
   flagging odd sessions). Reports ms per reader open and per batch read (best of 5); `--s3`: the
   same with the batches copied into SeaweedFS (started here, 127.0.0.1), where a listing is a request.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tracefleet.contract import layout
from tracefleet.bucket import LocalBucket, S3Bucket
from tracefleet.contract.session import EvalOutcome
from tracefleet.diagnostics.backtest import DiagnosticReport, backtest, selected
from tracefleet.diagnostics.base import Finding
from tracefleet.diagnostics.evidence import HarnessEvidence, session_evidence
from tracefleet.diagnostics.registry import run_diagnostics
from tracefleet.runner.tracing import SessionOutcome, session_traces
from tracefleet.traces.overlay import Overlay, write_overlay
from tracefleet.traces.reader import BatchReader
from tracefleet.traces.seal import Sealer
from tracefleet.traces.synthetic import SyntheticSession


def patch_text(i: int) -> str:
    parts = []
    for f in ("src/calc.py", "src/util.py", "README.md"):
        added = "".join(f"+    value_{i}_{k} = compute({k})\n" for k in range(13))
        parts.append(f"diff --git a/{f} b/{f}\n--- a/{f}\n+++ b/{f}\n@@ -1,2 +1,15 @@\n def f():\n{added}     return 0\n")
    return "".join(parts)


# An agent's turns: what it says and the shell command it asks for (read, edit, test).
TURNS = [
    ("Let me look at the code first.", "cat src/calc.py"),
    ("The bug is in add: it subtracts. Fixing it.", "sed -i 's/return a - b/return a + b/' src/calc.py"),
    ("Now the tests.", "python -m pytest -q"),
]
SUMMARY = (  # ~300 words, none repeated in runs: what a final answer looks like
    "I fixed the bug in `add`: it returned `a - b` instead of `a + b`. I changed the return statement in src/calc.py, "
    "kept the signature and the docstring as they were, and ran the test suite with pytest. All tests pass now, "
    "including test_add, which failed before, and test_mul, which passed before and still does. I did not touch the "
    "tests or the configuration, so the diff is the one line in src/calc.py plus the helper in src/util.py that the "
    "README now mentions. Two things you may want to look at later, though neither is needed for this fix: mul has no "
    "test for negative numbers, and the module has no type hints, which a checker such as mypy would need to say "
    "anything useful about callers. If you want, I can add a parametrized test that covers zero, negative and large "
    "values for both functions, and the hints, in a separate change so this one stays easy to review. The full output "
    "of the last test run was two passed in a few hundredths of a second, with no warnings. Nothing else in the "
    "repository refers to add, so no caller depended on the wrong result; I checked with grep before and after the "
    "change to be sure of that. How I verified it: I ran the failing test alone first to see the assertion, applied "
    "the fix, ran it alone again, then ran everything. I also tried add with a few more pairs in a Python shell (0 and "
    "0, -2 and 7, 10**9 and 1) and got the sums I expected. The helper in src/util.py formats the numbers the CLI "
    "prints; it was missing a case for negative values, which the README's example uses, so I added that case and a "
    "line in the README that shows it. Let me know if you would like the extra tests now or in a follow-up."
)


def turn(k: int) -> dict:
    text, command = TURNS[k % len(TURNS)]
    return {"output_text": text,
            "tool_calls": [{"id": f"call_{k}", "name": "Bash", "arguments": json.dumps({"command": command}), "kind": "function"}]}


def reader_cost(bucket: LocalBucket | S3Bucket, job: str, passes: int = 5, **options: bool) -> dict[str, float]:
    """ms to open a reader (and list its batches), ms per batch read with the training table taken: the
    best of `passes` passes (the first pass pays for cold caches, whichever variant runs first)."""
    opens, reads = [], []
    for _ in range(passes):
        started = time.perf_counter()
        reader = BatchReader(bucket, job, **options)
        seqs = reader.seqs()
        opens.append(time.perf_counter() - started)
        started = time.perf_counter()
        rows = sum(reader.read(seq).training_table().num_rows for seq in seqs)
        reads.append((time.perf_counter() - started) / len(seqs))
    return {"open_ms": round(min(opens) * 1000, 2), "read_ms_per_batch": round(min(reads) * 1000, 2), "training_rows": rows}


def reading_costs(bucket: LocalBucket | S3Bucket, job: str, overlay: Overlay) -> dict[str, dict[str, float]]:
    """reader_cost without overlays, with overlays but none written, then with `overlay` written."""
    out = {"no_overlays": reader_cost(bucket, job, overlays=False), "overlays_none_written": reader_cost(bucket, job)}
    write_overlay(bucket, overlay)
    out["one_overlay"] = reader_cost(bucket, job)
    return out


def s3_reading_costs(local: LocalBucket, job: str, overlay: Overlay) -> dict[str, dict[str, float]]:
    """reading_costs with the job's batches copied into SeaweedFS."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from fixtures.s3 import start_seaweedfs

    server = start_seaweedfs()
    try:
        remote = S3Bucket(server.create_bucket(), "bench", **server.bucket_options())
        for obj in local.list(layout.batches_prefix(job)):
            remote.put(obj.key, local.get(obj.key))
        return reading_costs(remote, job, overlay)
    finally:
        server.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--s3", action="store_true", help="also measure reader cost against SeaweedFS")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-diag-"))
    bucket = LocalBucket(tmp / "bucket")
    job = "bench"
    t_evidence = t_diag = 0.0
    traces = []
    sealer = Sealer(bucket, job, spool=tmp / "spool")
    for i in range(args.sessions):
        sid = f"{job}-s{i}"
        capture = tmp / f"{sid}.jsonl"
        with SyntheticSession(capture, sid, seed=i) as sess:
            call = sess.call(sess.tokens(200), n_completion=40, **turn(0))
            for k in range(1, args.calls - 1):
                call = sess.call(sess.extend(call, sess.tokens(20)), parent=call, n_completion=40, **turn(k))
            sess.call(sess.extend(call, sess.tokens(20)), parent=call, n_completion=400, output_text=SUMMARY)
        started = time.perf_counter()
        ev = session_evidence(job=job, session_id=sid, task={"id": f"t{i // 4}", "prompt": "p"}, group_id=f"{job}/t{i // 4}",
                              sample_index=i % 4, capture=capture, patch=patch_text(i),
                              harness=HarnessEvidence(exit_code=0), evaluation=EvalOutcome(reward=float(i % 2)))
        t_evidence += time.perf_counter() - started
        started = time.perf_counter()
        findings = run_diagnostics(ev)
        t_diag += time.perf_counter() - started
        bucket.put(layout.evidence_key(job, sid), ev.model_dump_json().encode())
        outcome = SessionOutcome(job=job, session_id=sid, task_id=f"t{i // 4}", group_id=f"{job}/t{i // 4}", sample_index=i % 4,
                                 reward=float(i % 2), evaluator_status="ok")
        traces += session_traces(capture, outcome, findings=findings).traces
        if (i + 1) % 64 == 0 or i + 1 == args.sessions:
            sealer.seal(traces)
            traces = []
    n = args.sessions
    started = time.perf_counter()
    result = backtest(BatchReader(bucket, job, overlays=False), selected(None))
    reports, sessions, missing = result.reports, result.sessions, result.missing
    t_back = time.perf_counter() - started
    odd = DiagnosticReport("bench_odd", "1", "quarantine", findings={
        f"{job}-s{i}": [Finding(name="bench_odd", version="1", severity="error", message="odd", file="x.py", line=1,
                                action="quarantine")] for i in range(1, n, 2)}).overlay(job, result.seqs)
    reading_s3 = s3_reading_costs(bucket, job, odd) if args.s3 else None
    reading = reading_costs(bucket, job, odd)
    print(json.dumps({
        "sessions": n, "calls_per_session": args.calls,
        "evidence_ms_per_session": round(t_evidence / n * 1000, 3),
        "diagnostics_ms_per_session": round(t_diag / n * 1000, 3),
        "backtest_sessions_per_s": round(sessions / t_back, 1), "backtest_s": round(t_back, 2), "missing_evidence": missing,
        "flagged": {r.name: len(r.flagged) for r in reports},
        "reader": reading,
        **({"reader_s3": reading_s3} if reading_s3 is not None else {}),
    }, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
