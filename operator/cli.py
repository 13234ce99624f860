"""`tracefleet operator`: run the RolloutJob operator against the current kubeconfig or in-cluster."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from tracefleet.operator.config import DEFAULT_IMAGE, OperatorConfig
from tracefleet.contract import environment


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Watch RolloutJob resources and turn each into vLLM inference pods, harness pods with the capture proxy "
        "sidecar, evaluator Jobs and sealer Jobs; report progress in status, Events and the trainer webhook. "
        "Uses $KUBECONFIG (or ~/.kube/config, or the in-cluster service account). "
        "Install the CRD first: `kubectl apply -f crds/` or `helm install tracefleet charts/tracefleet`."
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], metavar="N",
                       help="watch only this namespace (repeatable); default: the current pod's namespace if "
                       "in-cluster, else 'default'")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (cluster-wide RBAC)")
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus /metrics port (0 disables; default 9090)")
    parser.add_argument("--liveness-port", type=int, default=8080, help="kopf liveness endpoint /healthz port (0 disables)")
    parser.add_argument("--bind-address", default="0.0.0.0", help="address of the metrics and liveness listeners (default 0.0.0.0)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between reconciles of each RolloutJob")
    parser.add_argument("--max-creates", type=int, default=100, help="most children one reconcile may create")
    parser.add_argument("--retry-backoff", type=float, default=10.0, help="first retry delay of a failed session (doubles)")
    parser.add_argument("--proxy-image", default=os.environ.get(environment.PROXY_IMAGE, DEFAULT_IMAGE),
                        help="image of the proxy sidecar and sealer Jobs")
    parser.add_argument("--evaluator-image", default=os.environ.get(environment.EVALUATOR_IMAGE, DEFAULT_IMAGE),
                        help="evaluator image when the RolloutJob names none")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def main(args: argparse.Namespace) -> int:
    import kopf
    from kubernetes import client, config

    from tracefleet.operator import metrics
    from tracefleet.operator.handlers import OperatorState, build_registry
    from tracefleet.operator.kube import Kube
    from tracefleet.operator.reconcile import Reconciler
    from tracefleet.operator.webhook import WebhookNotifier

    logging.basicConfig(level=getattr(logging, args.log_level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level != "debug":
        # kopf logs every successful timer run at INFO: once per job per interval is noise.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    cfg = client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = 32
    kube = Kube(client.ApiClient(cfg))
    notifier = WebhookNotifier().start()
    op_cfg = OperatorConfig(
        proxy_image=args.proxy_image,
        evaluator_image=args.evaluator_image,
        max_creates_per_reconcile=args.max_creates,
        retry_backoff_s=args.retry_backoff,
    )
    state = OperatorState(reconciler=Reconciler(kube=kube, cfg=op_cfg, notifier=notifier), interval_s=args.interval)
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.bind_address)
    namespaces = args.namespace or ([] if args.all_namespaces else [os.environ.get("POD_NAMESPACE") or "default"])
    try:
        asyncio.run(
            kopf.operator(
                registry=build_registry(state),
                standalone=True,  # one replica (chart: replicas 1, strategy Recreate); no peering objects needed
                clusterwide=args.all_namespaces,
                namespaces=namespaces,
                liveness_endpoint=f"http://{args.bind_address}:{args.liveness_port}/healthz" if args.liveness_port else None,
            )
        )
    finally:
        notifier.stop()
    return 0
