"""`tracefleet diagnose URI --job J [--diagnostic NAME|module:function ...]`: backtest diagnostics over a
job's sealed batches and the session evidence kept in the bucket (nothing is rewritten)."""

from __future__ import annotations

import argparse
import os
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uri", help="the job's output: s3://BUCKET/PREFIX or a local directory")
    parser.add_argument("--job", required=True, help="the RolloutJob's name")
    parser.add_argument("--diagnostic", action="append", metavar="NAME|module:function",
                        help="a built-in by name or a hook (module:function, importable from here); repeatable; "
                        "default: every built-in")


def main(args: argparse.Namespace) -> int:
    from tracefleet.traces.reader import BatchReader

    from .backtest import backtest, selected

    sys.path.insert(0, os.getcwd())  # a hook the user just wrote, next to them
    diagnostics = selected(args.diagnostic)
    reader = BatchReader(args.uri, args.job)
    reports, sessions, missing = backtest(reader, diagnostics)
    print(f"job {args.job}: {sessions} sealed sessions in {len(reader.seqs())} batches"
          + (f", {missing} without evidence (not judged)" if missing else ""))
    for report in reports:
        print("\n".join(report.lines()))
    return 0
