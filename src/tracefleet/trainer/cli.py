"""`tracefleet policy`: a trainer's weight sync from the command line (tracefleet.trainer.control).

    tracefleet policy update --engine http://127.0.0.1:8000 --weights /ckpt/step-3 --version 3
    tracefleet policy show --engine http://127.0.0.1:8000

`--engine` is an engine replica's root URL: the vLLM that `tracefleet engine --backend vllm` started for a
local run (`tracefleet run --engine-url`), an external one, or on a cluster each pod of the managed vLLM
Deployment (its Service URL when it runs one replica). Repeat it for several replicas: they are updated
in lockstep. The report is printed as JSON with `--json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tracefleet.usage import UsageError

from tracefleet.trainer.control import PolicyUpdateFailed, engine_state, update_policy

API_KEY_ENV = "VLLM_API_KEY"  # what vLLM itself reads for --api-key


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = sub.add_parser("update", help="pause the engine(s), load new weights, set the policy version, resume")
    up.add_argument("--engine", action="append", required=True, help="engine root URL (repeat for replicas)")
    up.add_argument("--weights", required=True, help="checkpoint directory, as the engine sees it")
    up.add_argument("--version", type=int, required=True, help="the new policy version (a non-negative integer)")
    up.add_argument("--mode", choices=("keep", "abort", "wait"), default="keep",
                    help="what happens to requests in flight (keep: frozen and continued; default)")
    up.add_argument("--weights-on-engine", action="store_true",
                    help="the directory is on the engines' machines only: do not check it here first")
    up.add_argument("--no-reset-cache", action="store_true", help="keep the prefix cache (KV of the old weights)")
    up.add_argument("--json", action="store_true", help="print the report as JSON")
    show = sub.add_parser("show", help="an engine's policy version, label and pause state")
    show.add_argument("--engine", action="append", required=True, help="engine root URL (repeatable)")


def main(args: argparse.Namespace) -> int:
    api_key = os.environ.get(API_KEY_ENV)
    if args.action == "show":
        for url in args.engine:
            print(json.dumps(engine_state(url, api_key=api_key)))
        return 0
    if args.version < 0:
        raise UsageError("--version must be a non-negative integer")
    try:
        report = update_policy(args.engine, args.weights, args.version, mode=args.mode, api_key=api_key,
                               reset_cache=not args.no_reset_cache, check=not args.weights_on_engine)
        failed = None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except PolicyUpdateFailed as exc:
        report, failed = exc.report, str(exc)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        steps = ", ".join(f"{k} {v:.2f} s" for k, v in report.step_seconds().items())
        flight = ", ".join(f"{f.engine}: {f.kept} kept, {f.aborted} aborted, {f.waiting} waiting" for f in report.in_flight)
        print(f"policy {report.version} {'FAILED' if failed else 'loaded'} from {report.weights} in {report.seconds:.2f} s "
              f"(generation paused {report.paused_seconds:.2f} s; {steps}); in flight: {flight or 'none'}")
    if failed:
        print(f"tracefleet policy update: {failed}", file=sys.stderr)
        return 1
    return 0
