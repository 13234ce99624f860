"""The one `tracefleet` command.

Each subcommand lives with the component that owns it; this module only knows the names. A
component module exposes `configure(parser: argparse.ArgumentParser) -> None` and
`main(args: argparse.Namespace) -> int`, and is imported only when its subcommand runs, so
`tracefleet --help` stays fast and the proxy image needs no operator dependencies.

Mistakes a user makes at the command line (a wrong path, a bad flag, a manifest that does not validate)
end in one line naming the problem and exit status 2: a component raises `UsageError` (or
`SystemExit("message")`), argparse errors are printed without the usage block, and no traceback is shown
for them. An unexpected exception in a one-shot command is one line too, with exit status 1
(TRACEFLEET_DEBUG=1 shows the traceback); the long-running servers keep Python's traceback in their logs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import dataclass

from tracefleet.usage import DEBUG_ENV, USAGE_EXIT, UsageError


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line (`tracefleet run: error: …`) instead of usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(USAGE_EXIT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


@dataclass(frozen=True)
class Subcommand:
    name: str
    module: str
    summary: str
    server: bool = False  # long-running: unexpected errors keep their traceback for the logs


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand("run", "tracefleet.runner.cli", "run a RolloutJob on this machine (no cluster, no GPU needed)"),
    Subcommand("proxy", "tracefleet.proxy.cli", "run the capture proxy in front of an inference engine", server=True),
    Subcommand("engine", "tracefleet.engine.cli", "serve a small model on CPU with the vLLM API subset the proxy uses",
               server=True),
    Subcommand("engine-gate", "tracefleet.proxy.engine_gate",
               "let only the job's engine key through to vLLM (a managed inference pod's port)", server=True),
    Subcommand("operator", "tracefleet.operator.cli", "run the Kubernetes operator for RolloutJob resources", server=True),
    Subcommand("traces", "tracefleet.traces.cli", "list, show and export trace batches in a bucket or directory"),
    Subcommand("diagnose", "tracefleet.diagnostics.cli",
               "backtest rollout diagnostics over a job's sealed batches and the evidence kept in the bucket"),
    Subcommand("policy", "tracefleet.trainer.cli",
               "put a trainer's new weights into a running job's engine(s): pause, load, version, resume"),
    Subcommand("train", "tracefleet.trainer.loop_cli",
               "the whole loop here: vLLM (CPU), the job's sessions, a GRPO trainer syncing its weights into the engine"),
    Subcommand("dashboard", "tracefleet.dashboard.cli",
               "a live read-only web page of the jobs and training loops in a folder or bucket", server=True),
    Subcommand("crd", "tracefleet.api.cli_crd", "write the RolloutJob CRD generated from the API model"),
    Subcommand("tasks", "tracefleet.runner.containers.cli",
               "build Harbor task folders' environment images (named by content, cached, optionally pushed)"),
    Subcommand("images", "tracefleet.images.cli",
               "build the images the Helm chart and the operator name (tracefleet, its operator, one per harness CLI)"),
    Subcommand("validate", "tracefleet.api.cli_validate", "check RolloutJob manifests and print every problem with its field path"),
)


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="tracefleet",
        description="Train LLM agents through their real harness: capture every model call at the token level, "
        "score sessions, and seal trainer-ready trace batches into a bucket.",
    )
    from tracefleet import __version__

    parser.add_argument("--version", action="version", version=f"tracefleet {__version__}")
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
        return USAGE_EXIT
    cmd = known[args.command]
    prog = f"tracefleet {cmd.name}"
    try:
        module = importlib.import_module(cmd.module)
        return int(module.main(args) or 0)
    except UsageError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return USAGE_EXIT
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        # `raise SystemExit("message")` is how components stop on a user's mistake: one line, status 2.
        print(f"{prog}: {exc.code}", file=sys.stderr)
        return USAGE_EXIT
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place a one-shot command's surprise becomes one line
        if cmd.server or os.environ.get(DEBUG_ENV):
            raise
        print(f"{prog}: error: {type(exc).__name__}: {exc} (set {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        return 1

