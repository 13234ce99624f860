"""`tracefleet validate FILE...`: check RolloutJob manifests with the cluster's rules, locally."""

from __future__ import annotations

import argparse
import sys

from pathlib import Path

from tracefleet.harbor.sources import is_tarball

from tracefleet.api.validation import check_harbor_source, document_name, problem_lines, validate_file, validate_text


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check RolloutJob manifests without a cluster, with the same schema and cross-field rules the "
        "kube-apiserver applies from the CRD: only the CRD's camelCase field names (samplesPerTask, not "
        "samples_per_task), metadata.name as the cluster and the job's child objects need it (a lowercase RFC 1123 "
        "name of at most 63 characters; with inference.managed it starts with a letter and has no dot), and a "
        "type error says the value it got. Every problem is printed as `FILE: field.path: message`; "
        "exit status 1 if any file has a problem. Files may hold several YAML documents; `-` reads stdin. "
        "Task sources given as local paths (workspace.repo, workspace.archive, tasks.uri) must exist, "
        "relative to the file's directory (stdin: the current directory), as `tracefleet run` reads them, and are "
        "reported with the schema problems in one pass; "
        "Harbor task folders a job names (spec.tasks.harbor) are checked too. A FILE that is a directory or a "
        "tarball is read as Harbor task folders (one, or a folder of them): each problem is printed as "
        "`FOLDER/TASK/FILE: field.path: message`."
    )
    parser.epilog = "examples:\n  tracefleet validate examples/*.yaml\n  tracefleet validate my-harbor-tasks/"
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("files", nargs="+", metavar="FILE", help="RolloutJob YAML files to check")
    parser.add_argument("-q", "--quiet", action="store_true", help="print problems only, not the OK lines")


def main(args: argparse.Namespace) -> int:
    bad = 0
    for name in args.files:
        if name != "-" and (Path(name).is_dir() or is_tarball(name)):
            count, found = check_harbor_source(name, Path.cwd())
            for problem in found:
                print(problem)
            bad += bool(found)
            if not found and not args.quiet:
                print(f"{name}: ok ({count} Harbor task{'s' if count != 1 else ''})", file=sys.stderr)
            continue
        try:
            results = validate_text(sys.stdin.read(), base_dir=Path.cwd(), job_dir=False) if name == "-" else validate_file(name)
        except OSError as err:
            print(f"{name}: cannot read: {err.strerror or err}")
            bad += 1
            continue
        for line in problem_lines(name, results):
            print(line)
        bad += sum(1 for _, problems in results if problems)
        if not args.quiet:
            for index, problems in results:
                if not problems:
                    print(f"{document_name(name, index, len(results))}: ok", file=sys.stderr)
    return 1 if bad else 0
