"""`tracefleet policy`: a trainer's weight sync from the command line (tracefleet.trainer.control).

    tracefleet policy update --engine http://127.0.0.1:8000 --weights /ckpt/step-3 --version 3
    tracefleet policy show --engine http://127.0.0.1:8000

`--engine` is an engine replica's root URL: the vLLM that `tracefleet engine --backend vllm` started for a
local run (`tracefleet run --engine-url`), an external one, or on a cluster each pod of the managed vLLM
Deployment. Repeat it for several replicas: they are updated in lockstep. On a cluster, `--service NS/NAME`
(or `--job NS/JOB`: the job's managed inference Service) resolves every ready replica from the Service's
EndpointSlices with the kubeconfig (or in-cluster) credentials and updates each (tracefleet.trainer.replicas);
the checkpoint directory is then taken as the pods see it. The report is printed as JSON with `--json`.
The engine's key is $VLLM_API_KEY; with `--job` and no such variable, the job's own, read from its Secret (the
engine gate in front of each replica lets nothing else through).

    tracefleet policy update --job rl/my-job --weights /ckpt/policy-3 --version 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tracefleet.usage import UsageError
from tracefleet.vllm import VLLM_API_KEY_ENV

from tracefleet.trainer.control import PolicyUpdateFailed, engine_state, update_policy, update_service_policy
from tracefleet.trainer.replicas import NoReplicas, inference_service_name, job_engine_key, split_ref


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = sub.add_parser("update", help="pause the engine(s), load new weights, set the policy version, resume")
    target = up.add_mutually_exclusive_group(required=True)
    target.add_argument("--engine", action="append", help="engine root URL (repeat for replicas)")
    target.add_argument("--service", metavar="[NS/]NAME", help="every ready replica behind this Kubernetes Service")
    target.add_argument("--job", metavar="[NS/]JOB", help="every replica of this RolloutJob's managed vLLM")
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


def service_ref(args: argparse.Namespace) -> tuple[str, str]:
    """(namespace, Service name) from --service or --job."""
    if args.service:
        return split_ref(args.service)
    namespace, job = split_ref(args.job)
    return namespace, inference_service_name(job)


def pod_note(pods: dict[str, str], url: str) -> str:
    return f" (pod {pods[url]})" if url in pods else ""


def main(args: argparse.Namespace) -> int:
    api_key = os.environ.get(VLLM_API_KEY_ENV)
    if args.action == "show":
        for url in args.engine:
            print(json.dumps(engine_state(url, api_key=api_key)))
        return 0
    if args.version < 0:
        raise UsageError("--version must be a non-negative integer")
    try:
        if api_key is None and args.job:  # the gate in front of the job's engine asks for the job's key
            api_key = job_engine_key(*split_ref(args.job))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    options = {"mode": args.mode, "api_key": api_key, "reset_cache": not args.no_reset_cache}
    try:
        if args.engine:
            report = update_policy(args.engine, args.weights, args.version, check=not args.weights_on_engine, **options)
        else:
            report = update_service_policy(*service_ref(args), args.weights, args.version, **options)
        failed = None
    except (ValueError, NoReplicas) as exc:
        raise UsageError(str(exc)) from None
    except PolicyUpdateFailed as exc:
        report, failed = exc.report, str(exc)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        steps = ", ".join(f"{k} {v:.2f} s" for k, v in report.step_seconds().items())
        flight = ", ".join(f"{f.engine}{pod_note(report.pods, f.engine)}: {f.kept} kept, {f.aborted} aborted, {f.waiting} waiting" for f in report.in_flight)
        print(f"policy {report.version} {'FAILED' if failed else 'loaded'} from {report.weights} in {report.seconds:.2f} s "
              f"(generation paused {report.paused_seconds:.2f} s; {steps}); in flight: {flight or 'none'}")
    if failed:
        print(f"tracefleet policy update: {failed}", file=sys.stderr)
        return 1
    return 0
