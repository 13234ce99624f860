"""Diagnostics cost per session and backtest throughput.

    .venv/bin/python bench/diagnostics.py [--sessions 1000] [--calls 8]

1. Evidence + diagnostics: for each session, `session_evidence` over a capture log of `--calls` calls
   (each with a tool call, 200-token prompts, 40-token completions) and a 3-file, 40-line patch, then
   every built-in (`run_diagnostics`, the default set). Reports ms/session for each step.
2. Backtest: the sessions sealed as one job (groups of 4, one batch per 64 sessions) with their evidence
   in a local bucket, then `backtest` with every built-in. Reports sessions/s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tracefleet import layout
from tracefleet.bucket import LocalBucket
from tracefleet.diagnostics.backtest import backtest, selected
from tracefleet.diagnostics.evidence import HarnessEvidence, session_evidence
from tracefleet.diagnostics.registry import run_diagnostics
from tracefleet.runner.tracing import SessionOutcome, session_traces
from tracefleet.traces.reader import BatchReader
from tracefleet.traces.seal import Sealer
from tracefleet.traces.synthetic import SyntheticSession


def patch_text(i: int) -> str:
    parts = []
    for f in ("src/calc.py", "src/util.py", "README.md"):
        added = "".join(f"+    value_{i}_{k} = compute({k})\n" for k in range(13))
        parts.append(f"diff --git a/{f} b/{f}\n--- a/{f}\n+++ b/{f}\n@@ -1,2 +1,15 @@\n def f():\n{added}     return 0\n")
    return "".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=8)
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
            call = sess.call(sess.tokens(200), n_completion=40)
            for _ in range(args.calls - 1):
                call = sess.call(sess.extend(call, sess.tokens(20)), parent=call, n_completion=40)
        started = time.perf_counter()
        ev = session_evidence(job=job, session_id=sid, task={"id": f"t{i // 4}", "prompt": "p"}, group_id=f"{job}/t{i // 4}",
                              sample_index=i % 4, capture=capture, patch=patch_text(i),
                              harness=HarnessEvidence(exit_code=0), evaluation={"status": "ok", "reward": float(i % 2)})
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
    reports, sessions, missing = backtest(BatchReader(bucket, job), selected(None))
    t_back = time.perf_counter() - started
    print(json.dumps({
        "sessions": n, "calls_per_session": args.calls,
        "evidence_ms_per_session": round(t_evidence / n * 1000, 3),
        "diagnostics_ms_per_session": round(t_diag / n * 1000, 3),
        "backtest_sessions_per_s": round(sessions / t_back, 1), "backtest_s": round(t_back, 2), "missing_evidence": missing,
        "flagged": {r.name: len(r.flagged) for r in reports},
    }, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
