"""`tracefleet diagnose URI --job J [--diagnostic NAME|module:function ...] [--write-overlay] [--html PATH]`:
backtest diagnostics over a job's sealed batches and the session evidence kept in the bucket (sealed
batches are never rewritten). `--write-overlay` writes each diagnostic's verdicts as an overlay the
reader applies (tracefleet.traces.overlay); `--html` writes one page with the flagged sessions' evidence
(tracefleet.diagnostics.page)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tracefleet.diagnostics.base import ACTIONS


def configure(parser: argparse.ArgumentParser) -> None:
    from tracefleet.traces.cli import add_bucket_options

    parser.add_argument("uri", help="the job's output: s3://BUCKET/PREFIX or a local directory")
    parser.add_argument("--job", required=True, help="the RolloutJob's name")
    parser.add_argument("--diagnostic", action="append", metavar="NAME|module:function",
                        help="a built-in by name or a hook (module:function, importable from here); repeatable; "
                        "default: every built-in")
    parser.add_argument("--write-overlay", action="store_true",
                        help="write each diagnostic's verdicts as an overlay: BatchReader then leaves the sessions it "
                        "quarantines out of training (the newest overlay of a diagnostic replaces its older ones)")
    parser.add_argument("--action", choices=ACTIONS, default="quarantine",
                        help="what an overlay does with the sessions it flags (default quarantine; flag: findings only)")
    parser.add_argument("--html", metavar="PATH", help="write one self-contained page with the flagged sessions' evidence")
    add_bucket_options(parser)


def main(args: argparse.Namespace) -> int:
    from tracefleet.bucket import BucketError
    from tracefleet.traces.cli import bucket_from_args
    from tracefleet.traces.overlay import write_overlay
    from tracefleet.traces.reader import BatchReader

    from tracefleet.diagnostics.backtest import backtest, selected
    from tracefleet.diagnostics.page import backtest_page

    sys.path.insert(0, os.getcwd())  # a hook the user just wrote, next to them
    diagnostics = selected(args.diagnostic, args.action)
    try:
        bucket = bucket_from_args(args)
        bucket.check()
        reader = BatchReader(bucket, args.job, overlays=False)  # against what was sealed, not earlier overlays
        seqs = reader.seqs()
    except ValueError as exc:  # an invalid job name
        raise SystemExit(str(exc)) from None
    except BucketError as exc:
        raise SystemExit(str(exc)) from None  # it names the bucket
    if not seqs:
        raise SystemExit(f"job {args.job!r} has no sealed batches in {bucket.uri}")
    result = backtest(reader, diagnostics)
    print(f"job {args.job}: {result.sessions} sealed sessions in {len(seqs)} batches"
          + (f", {result.missing} without evidence (not judged)" if result.missing else ""))
    for report in result.reports:
        print("\n".join(report.lines()))
    if args.write_overlay:
        for report in result.reports:
            try:
                key = write_overlay(bucket, report.overlay(reader.job, seqs))
            except ValueError as exc:  # a hook whose name cannot be a key
                raise SystemExit(str(exc)) from None
            print(f"overlay {report.name}: {len(report.flagged)} sessions, action {report.action}: {key}")
    if args.html:
        path = Path(args.html)
        try:
            path.write_text(backtest_page(reader.job, result), encoding="utf-8")
        except OSError as exc:
            raise SystemExit(f"--html {path}: {exc.strerror or exc}") from None
        print(f"page: {path}")
    return 0
