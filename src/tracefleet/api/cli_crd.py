"""`tracefleet crd`: regenerate the CRD (and the docs' manifest reference page) from the API model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tracefleet.api.crd import CRD_FILENAME, crd_yaml, write_crd
from tracefleet.api.reference import REFERENCE_PAGE, manifest_reference, update_page
from tracefleet.usage import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Generate the RolloutJob CustomResourceDefinition from the pydantic model (src/tracefleet/contract/job.py). "
        f"By default writes crds/{CRD_FILENAME} and refreshes the manifest reference in {REFERENCE_PAGE} "
        "(when run in the repository); install the CRD with `kubectl apply -f crds/`."
    )
    parser.epilog = (
        "examples:\n"
        f"  tracefleet crd                      # rewrite crds/ and {REFERENCE_PAGE} after changing the model\n"
        "  tracefleet crd --stdout | kubectl apply -f -\n"
        "  tracefleet crd --reference          # print the manifest reference (markdown)"
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--out", default="crds", metavar="DIR", help="directory to write the CRD into (default: crds)")
    parser.add_argument("--stdout", action="store_true", help="print the CRD instead of writing a file")
    parser.add_argument("--reference", action="store_true", help="print the manifest reference (markdown) and exit")
    parser.add_argument(
        "--reference-page", metavar="FILE",
        help=f"rewrite FILE's manifest-reference section (default: {REFERENCE_PAGE} when it exists; not with --stdout)")


def main(args: argparse.Namespace) -> int:
    if args.reference:
        sys.stdout.write(manifest_reference())
        return 0
    if args.stdout:
        sys.stdout.write(crd_yaml())
    else:
        path = write_crd(Path(args.out))
        print(f"wrote {path}", file=sys.stderr)
    page = args.reference_page
    if page is None and not args.stdout and Path(REFERENCE_PAGE).is_file():
        page = REFERENCE_PAGE
    if page is not None:
        try:
            changed = update_page(page)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--reference-page {page}: {exc}") from None
        print(f"{'updated' if changed else 'unchanged'} {page}", file=sys.stderr)
    return 0
