"""The one `tracefleet` command.

Each subcommand lives with the component that owns it; this module only knows the names. A
component module exposes `configure(parser: argparse.ArgumentParser) -> None` and
`main(args: argparse.Namespace) -> int`, and is imported only when its subcommand runs, so
`tracefleet --help` stays fast and the proxy image needs no operator dependencies.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Subcommand:
    name: str
    module: str
    summary: str


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand("run", "tracefleet.runner.cli", "run a RolloutJob on this machine (no cluster, no GPU needed)"),
    Subcommand("proxy", "tracefleet.proxy.cli", "run the capture proxy in front of an inference engine"),
    Subcommand("engine", "tracefleet.engine.cli", "serve a small model on CPU with the vLLM API subset the proxy uses"),
    Subcommand("operator", "tracefleet.operator.cli", "run the Kubernetes operator for RolloutJob resources"),
    Subcommand("traces", "tracefleet.traces.cli", "list, show and export trace batches in a bucket or directory"),
    Subcommand("crd", "tracefleet.api.cli_crd", "write the RolloutJob CRD generated from the API model"),
    Subcommand("validate", "tracefleet.api.cli_validate", "check RolloutJob manifests and print every problem with its field path"),
)


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tracefleet",
        description="Train LLM agents through their real harness: capture every model call at the token level, "
        "score sessions, and seal trainer-ready trace batches into a bucket.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for cmd in SUBCOMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.summary, description=cmd.summary)
        if cmd.name == load:
            importlib.import_module(cmd.module).configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    known = {c.name: c for c in SUBCOMMANDS}
    parser = build_parser(chosen if chosen in known else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(known[args.command].module)
    return int(module.main(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
