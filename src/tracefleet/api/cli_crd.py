"""`tracefleet crd`: regenerate the CRD (and the README manifest reference) from the API model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tracefleet.api.crd import CRD_FILENAME, crd_yaml, write_crd
from tracefleet.api.reference import manifest_reference, update_readme


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Generate the RolloutJob CustomResourceDefinition from the pydantic model (src/tracefleet/contract/job.py). "
        f"By default writes crds/{CRD_FILENAME}; install it with `kubectl apply -f crds/`."
    )
    parser.epilog = (
        "examples:\n"
        "  tracefleet crd                      # rewrite crds/ after changing the model\n"
        "  tracefleet crd --stdout | kubectl apply -f -\n"
        "  tracefleet crd --readme README.md   # also refresh the README manifest reference\n"
        "  tracefleet crd --reference          # print the manifest reference (markdown)"
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--out", default="crds", metavar="DIR", help="directory to write the CRD into (default: crds)")
    parser.add_argument("--stdout", action="store_true", help="print the CRD instead of writing a file")
    parser.add_argument("--reference", action="store_true", help="print the manifest reference (markdown) and exit")
    parser.add_argument("--readme", metavar="FILE", help="also rewrite FILE's manifest-reference section")


def main(args: argparse.Namespace) -> int:
    if args.reference:
        sys.stdout.write(manifest_reference())
        return 0
    if args.stdout:
        sys.stdout.write(crd_yaml())
    else:
        path = write_crd(Path(args.out))
        print(f"wrote {path}", file=sys.stderr)
    if args.readme:
        changed = update_readme(args.readme)
        print(f"{'updated' if changed else 'unchanged'} {args.readme}", file=sys.stderr)
    return 0
