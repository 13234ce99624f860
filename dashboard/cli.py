"""`tracefleet dashboard URI`: serve the read-only dashboard of the jobs and loops under a local output folder or
an s3:// prefix (tracefleet.dashboard.app), until interrupted."""

from __future__ import annotations

import argparse

DEFAULT_PORT = 8090


def configure(parser: argparse.ArgumentParser) -> None:
    from tracefleet.traces.cli import add_bucket_options

    parser.add_argument("uri", help="a local output folder, a job's folder, a `tracefleet train` run folder, or s3://BUCKET/PREFIX")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--kubernetes", action="store_true",
                        help="also show the running count and ETA of the cluster's RolloutJobs writing under URI (their "
                             "status; in-cluster config, else the kubeconfig)")
    parser.add_argument("-n", "--namespace", action="append", default=[], metavar="N",
                        help="with --kubernetes: a namespace to read RolloutJobs in (repeat; default every namespace)")
    add_bucket_options(parser)


def main(args: argparse.Namespace) -> int:
    import socket
    import sys

    import uvicorn

    from tracefleet.bucket import BucketError
    from tracefleet.dashboard.app import MANIFEST_BUDGET_S, create_app
    from tracefleet.dashboard.source import Source

    options = {k: v for k, v in {"endpoint_url": args.endpoint_url, "profile": args.profile, "region": args.region}.items() if v}
    progress_from = None
    if args.kubernetes:
        from tracefleet.dashboard.cluster import RolloutJobProgress

        progress_from = RolloutJobProgress(str(args.uri), args.namespace)
    try:
        source = Source(str(args.uri), progress_from, **(options if str(args.uri).startswith("s3://") else {}))
        source.refresh(MANIFEST_BUDGET_S, strict=True)  # at start, a store it cannot read: one line, exit 2
    except BucketError as exc:
        raise SystemExit(str(exc)) from None
    if source.missing:
        print(f"tracefleet dashboard: {source.missing}: nothing to show until a run writes there "
              "(is the URI right?)", file=sys.stderr, flush=True)
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
        sock.listen(128)  # before the line that names the address: a client reading it may connect at once
    except OSError as exc:
        raise SystemExit(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    host, port = sock.getsockname()[:2]
    jobs, loops = len(source.jobs), len(source.loops)
    print(f"dashboard of {source.uri} ({jobs} job(s), {loops} loop(s) so far): http://{host}:{port}/", flush=True)
    source.start()
    try:
        config = uvicorn.Config(create_app(source), log_level="warning", access_log=False)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        source.stop()
    return 0
