"""`tracefleet operator`: run the RolloutJob operator against the current kubeconfig or in-cluster."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator

from tracefleet.operator.config import DEFAULT_HARNESS_IMAGE, DEFAULT_IMAGE, OperatorConfig
from tracefleet.operator.leader import LEASE_DURATION_S, LEASE_NAME, RENEW_DEADLINE_S, RETRY_S
from tracefleet.contract import environment
from tracefleet.contract.job import OBJECT_NAME_RE


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
    parser.add_argument("--harness-image", default="", metavar="TEMPLATE",
                        help="spec.harness.image of a job that names none, {preset} replaced by its preset (a "
                        f"`command` harness gets --proxy-image), e.g. {DEFAULT_HARNESS_IMAGE}; default: none, the "
                        "job must name it")
    parser.add_argument("--evaluator-image", default=os.environ.get(environment.EVALUATOR_IMAGE, DEFAULT_IMAGE),
                        help="evaluator image when the RolloutJob names none")
    parser.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME", dest="image_pull_secrets",
                        help="a Secret (kubernetes.io/dockerconfigjson) every job's pods pull their images with, in the "
                        "job's namespace (repeatable; a job's spec.imagePullSecrets add to these)")
    parser.add_argument("--bucket-endpoint", default=os.environ.get(environment.S3_ENDPOINT) or None, metavar="URL",
                        help="the S3 endpoint every job's pods reach the bucket at (an in-cluster MinIO or SeaweedFS); "
                        "default: the job's credentials Secret's AWS_ENDPOINT_URL, else AWS. The jobs' NetworkPolicies "
                        "let their pods reach it")
    ha = parser.add_argument_group("high availability (tracefleet.operator.leader)")
    ha.add_argument("--leader-elect", action="store_true",
                    help="run as one of several replicas: only the holder of a coordination.k8s.io Lease reconciles")
    ha.add_argument("--lease-name", default=LEASE_NAME, help=f"the Lease's name (default {LEASE_NAME})")
    ha.add_argument("--lease-namespace", default=None,
                    help="the Lease's namespace (default: the pod's namespace, $POD_NAMESPACE, else 'default')")
    ha.add_argument("--lease-identity", default=None, help="this replica's name in the Lease (default: $POD_NAME, else host-pid)")
    ha.add_argument("--lease-duration", type=float, default=LEASE_DURATION_S,
                    help=f"seconds a standby waits, seeing the Lease unrenewed, before taking it (default {LEASE_DURATION_S:g})")
    ha.add_argument("--lease-renew-deadline", type=float, default=RENEW_DEADLINE_S,
                    help=f"seconds the leader may fail to renew before it stops (default {RENEW_DEADLINE_S:g})")
    ha.add_argument("--lease-retry", type=float, default=RETRY_S,
                    help=f"seconds between renewals and standby attempts (default {RETRY_S:g})")
    parser.add_argument("--dashboard-url", default="", metavar="URL",
                        help="the chart's `tracefleet dashboard` (its Service): each job it shows gets its page's URL "
                             "in status.dashboardUrl")
    parser.add_argument("--dashboard-uri", default="", metavar="URI", help="the bucket folder that dashboard reads")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def main(args: argparse.Namespace) -> int:
    if args.leader_elect and not args.lease_retry < args.lease_renew_deadline < args.lease_duration:
        print("tracefleet operator: the Lease needs --lease-retry < --lease-renew-deadline < --lease-duration", file=sys.stderr)
        return 2
    if bad := [name for name in args.image_pull_secrets if not re.fullmatch(OBJECT_NAME_RE, name)]:
        print(f"tracefleet operator: --image-pull-secret {bad[0]!r} is not a Secret's name (lowercase letters, digits, "
              "'-' and '.')", file=sys.stderr)
        return 2
    import kopf
    from kubernetes import client

    from tracefleet.cluster_config import load_cluster_config

    from tracefleet.operator import metrics
    from tracefleet.operator.handlers import OperatorState, build_registry
    from tracefleet.operator.harness_watch import HarnessWatch
    from tracefleet.operator.kube import Kube
    from tracefleet.operator.reconcile import Reconciler
    from tracefleet.operator.webhook import WebhookNotifier

    logging.basicConfig(level=getattr(logging, args.log_level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level != "debug":
        # kopf logs every successful timer run at INFO: once per job per interval is noise.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    load_cluster_config()
    cfg = client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = 32
    kube = Kube(client.ApiClient(cfg))
    notifier = WebhookNotifier().start()
    op_cfg = OperatorConfig(
        proxy_image=args.proxy_image,
        evaluator_image=args.evaluator_image,
        harness_image=args.harness_image,
        max_creates_per_reconcile=args.max_creates,
        retry_backoff_s=args.retry_backoff,
        dashboard_url=args.dashboard_url,
        dashboard_uri=args.dashboard_uri,
        bucket_endpoint=args.bucket_endpoint,
        image_pull_secrets=tuple(args.image_pull_secrets),
    )
    state = OperatorState(reconciler=Reconciler(kube=kube, cfg=op_cfg, notifier=notifier, harness=HarnessWatch(kube)),
                          interval_s=args.interval)
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.bind_address)
    namespaces = args.namespace or ([] if args.all_namespaces else [os.environ.get("POD_NAMESPACE") or "default"])
    elector = None
    if args.leader_elect:
        from tracefleet.operator.leader import EXIT_LEASE_LOST, LeaseElector, default_identity

        elector = LeaseElector(kube, args.lease_namespace or os.environ.get("POD_NAMESPACE") or "default",
                               args.lease_identity or default_identity(), args.lease_name, args.lease_duration,
                               args.lease_renew_deadline, args.lease_retry)
        with standby_liveness(args.bind_address, args.liveness_port):
            elector.wait_until_leading()
        # a leader that cannot renew stops at once, before a standby may take the Lease (no graceful
        # shutdown: a pass still running must not go on creating children)
        elector.keep_leading(lambda: os._exit(EXIT_LEASE_LOST))
    settings = kopf.OperatorSettings()
    # Served namespaces only (the chart's Roles): no right to list namespaces or watch CRDs, so kopf serves the
    # namespaces it is given and finds the RolloutJob resource once, at start, instead of retrying a forbidden
    # cluster-wide list for a minute first.
    settings.scanning.disabled = not args.all_namespaces
    try:
        asyncio.run(
            kopf.operator(
                registry=build_registry(state),
                settings=settings,
                # no kopf peering: with --leader-elect the Lease decides which replica runs (tracefleet.operator.leader)
                standalone=True,
                clusterwide=args.all_namespaces,
                namespaces=namespaces,
                liveness_endpoint=f"http://{args.bind_address}:{args.liveness_port}/healthz" if args.liveness_port else None,
            )
        )
    finally:
        notifier.stop()
        if elector is not None:
            elector.release()
    return 0


@contextlib.contextmanager
def standby_liveness(addr: str, port: int) -> Iterator[None]:
    """/healthz answers 200 while the replica waits as a standby (kopf serves it once leading)."""
    if not port:
        yield
        return

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200 if self.path.startswith("/healthz") else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer((addr, port), Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield
    finally:
        srv.shutdown()
        srv.server_close()
