"""`tracefleet run JOB.yaml`: run a RolloutJob on this machine (no cluster, no GPU needed)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tracefleet.usage import DEBUG_ENV, USAGE_EXIT, UsageError, positive_int

EPILOG = """\
examples:
  tracefleet run examples/quickstart/job.yaml
      the quickstart: a CPU model, a tiny agent, 3 tasks x 4 samples; batches in ./tracefleet-output
  tracefleet run job.yaml --engine-url http://127.0.0.1:8000 --output s3://bucket/rollouts
      use an engine you already run (vLLM, tracefleet engine) and seal batches to S3
  tracefleet run job.yaml --accept 'reward>=1'
      offline data generation: keep only sessions the evaluator accepted (SFT data)

Rerunning the same job (same metadata.name, same output) continues: sessions whose traces are already
in a sealed batch are not run again, but those sealed after failing before their first model call (a
harness that could not start: fix it, then rerun). `--fresh` runs every session again and adds new
batches after the sealed ones (it deletes nothing). Ctrl-C stops cleanly: running sessions are killed
and what finished is sealed. Inspect the result with `tracefleet traces ls OUTPUT --job JOB`.

Before it starts an engine, the run checks that the job can start here (the harness CLI of its preset
installed, the `command` preset's program and script found, the CPU engine installed, the local task
paths there) and stops with one line per problem naming the setup part to run.

Output: progress (start-up, sessions as they finish, a failed session's reason) on stderr; the summary, the
commands to inspect the result and the FAILED: lines that say why a run failed on stdout. Exit status: 0 the
run succeeded, 1 it failed (FAILED: lines say why) or could not start, 2 a usage or job-file error,
130 interrupted (what finished is sealed).
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("job", type=Path, metavar="JOB.yaml", nargs="?",
                        help="a RolloutJob manifest (see `tracefleet validate`)")
    parser.add_argument("--in-pod", action="store_true",
                        help="run ONE session inside a harness pod the operator created (no JOB.yaml: task, preset, "
                        "proxy URL and secret come from the TRACEFLEET_* env it sets; artifacts go to "
                        "$TRACEFLEET_ARTIFACTS_DIR for the proxy sidecar to upload); see tracefleet.runner.pod.in_pod")
    parser.add_argument("--output", "-o", metavar="URI",
                        help="where batches go: a local directory or s3://BUCKET/PREFIX (default: spec.output.uri)")
    parser.add_argument("--engine-url", metavar="URL",
                        help="root URL of an OpenAI-compatible engine to use instead of starting the CPU engine")
    parser.add_argument("--accept", metavar="EXPR",
                        help="seal only sessions whose reward matches, e.g. 'reward>=1' (reported as accepted/attempted)")
    parser.add_argument("--parallelism", "-j", type=positive_int, metavar="N", help="sessions at once (default: spec.parallelism)")
    parser.add_argument("--work-dir", type=Path, metavar="DIR",
                        help="session workspaces, capture logs and the engine log (default: $TMPDIR/tracefleet/JOB)")
    parser.add_argument("--netns", choices=("auto", "on", "off"), default="auto",
                        help="run each harness in a loopback-only network namespace where the proxy is the only "
                        "reachable endpoint (auto: when `unshare -rn` works here)")
    parser.add_argument("--engine-threads", type=positive_int, default=1, metavar="N", help="CPU threads for the local engine")
    parser.add_argument("--keep-workspaces", action="store_true", help="keep every session's workspace copies")
    parser.add_argument("--fresh", action="store_true",
                        help="start the job over: run every session again, also those already in sealed batches; "
                        "the sealed batches stay (nothing is deleted) and the new ones follow them in the output")
    from tracefleet.proxy.cli import add_engine_arguments

    add_engine_arguments(parser, defaults=False)


def check_job_file(job: Path | None) -> list[str]:
    """Every problem with the job file a run can see before it starts anything, as the lines
    `tracefleet validate` prints (`FILE: field.path: message`); a missing or unusable path raises UsageError."""
    from tracefleet.api.validation import problem_lines, validate_file

    if job is None:
        raise UsageError("JOB.yaml is required (or --in-pod inside an operator-created pod)")
    if job.is_dir():
        inside = sorted(p.name for p in job.glob("*.y*ml"))
        hint = f" (it holds {', '.join(inside)})" if inside else ""
        raise UsageError(f"{job} is a directory: give the RolloutJob file{hint}")
    if not job.exists():
        raise UsageError(f"{job}: no such file")
    try:
        # a Harbor task folder with problems is refused alone, its sessions fail-closed rows: the job goes on
        results = validate_file(job, task_folders=False)
    except OSError as err:
        raise UsageError(f"{job}: cannot read: {err.strerror or err}") from None
    if len(results) > 1:
        raise UsageError(f"{job} holds {len(results)} YAML documents; `tracefleet run` takes one RolloutJob per file")
    return problem_lines(str(job), results)


def main(args: argparse.Namespace) -> int:
    if args.in_pod:
        from tracefleet.runner.pod.in_pod import main as pod_main

        return pod_main()
    from tracefleet.runner.local import Acceptance, LocalOptions, run_local

    problems = check_job_file(args.job)
    if problems:
        for line in problems:
            print(f"tracefleet run: {line}", file=sys.stderr)
        return USAGE_EXIT
    if args.accept:
        try:
            Acceptance.parse(args.accept)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    options = LocalOptions(
        job_path=args.job,
        output=args.output,
        engine_url=args.engine_url,
        accept=args.accept,
        work_dir=args.work_dir,
        netns=args.netns,
        parallelism=args.parallelism,
        engine_threads=args.engine_threads,
        keep_workspaces=args.keep_workspaces,
        engine_timeouts={key: value for key, value in (
            ("connect_s", args.engine_connect_timeout_s), ("first_token_s", args.engine_first_token_timeout_s),
            ("inter_token_s", args.engine_inter_token_timeout_s), ("total_s", args.engine_total_timeout_s))
            if value is not None},
        logprobs_mode=args.logprobs_mode,
        fresh=args.fresh,
    )
    from tracefleet.runner.preflight import PreflightError

    try:
        return run_local(options)
    except PreflightError as exc:
        # before any engine started: each line says what to install or change
        for line in exc.problems:
            print(f"tracefleet run: {line}", file=sys.stderr)
        return 1
    except (RuntimeError, ValueError, OSError) as exc:
        # Start-up problems (engine, proxy, job file, bucket) are for the user to fix: say what, not where.
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"tracefleet run: error: {exc}", file=sys.stderr)
        return 1
