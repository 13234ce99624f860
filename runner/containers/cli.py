"""`tracefleet tasks build SOURCE [--push REGISTRY]`: build every Harbor task's environment/ into its image (named
by content, see images.py), before a job runs them. One line per task; a task that does not build is one line
with its name and the build's last error line, and the others go on (exit status 1 if any failed)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tracefleet.harbor.folders import check_tasks
from tracefleet.harbor.sources import TaskSourceError, open_source

from tracefleet.runner.containers.images import build_task_image
from tracefleet.runner.containers.runtime import ContainerError, require_runtime


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Work with Harbor task folders. `build` builds each task's environment/ (its Dockerfile) into the image "
        "the task runs in, named localhost/tracefleet-task/<task>:<sha256 of environment/, 16 digits> "
        "(REGISTRY/tracefleet-task/... with --push), so an unchanged folder is found again and not rebuilt. A "
        "task whose task.toml names environment.docker_image is not built."
    )
    parser.epilog = "examples:\n  tracefleet tasks build my-harbor-tasks/\n  tracefleet tasks build tb2.tar.gz " \
                    "--push registry.example.com:5000 --include 'swe-*'"
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    build = sub.add_parser("build", help="build each task's environment image (cached by content)")
    build.add_argument("source", metavar="SOURCE", help="a folder of task folders (or one), a tarball, or s3://...")
    build.add_argument("--push", metavar="REGISTRY", help="also push each image to REGISTRY (e.g. host:5000/team)")
    build.add_argument("--include", action="append", metavar="PATTERN", help="only tasks whose name matches")
    build.add_argument("--logs", metavar="DIR", type=Path, help="keep each build's full log in DIR")


def main(args: argparse.Namespace) -> int:
    try:
        runtime = require_runtime()
    except ContainerError as err:
        raise SystemExit(str(err)) from None
    with tempfile.TemporaryDirectory(prefix="tracefleet-tasks-") as tmp:
        try:
            root = open_source(args.source, Path(tmp) / "source", Path.cwd())
        except TaskSourceError as err:
            raise SystemExit(str(err)) from None
        tasks, problems = check_tasks(root, args.source, args.include)
        for problem in problems:
            print(problem)
        failed = 0
        for task in tasks:
            result = build_task_image(runtime, task, args.logs, args.push)
            print(result.line(), flush=True)
            failed += result.status == "failed"
    return 1 if failed or problems else 0
