"""`tracefleet images build|list`: build the images the Helm chart and the operator name, tagged for a registry.

A subcommand rather than a Makefile recipe alone: the image names, the harness presets and the bundle layout are
the package's own (tracefleet.contract.images, runner/presets/pins.json, tracefleet.runner.containers.bundle),
and the container runtime is found the way `tracefleet tasks build` finds it (podman with runc, or docker).
`make images` runs the setup parts the build needs, then this."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tracefleet.contract import images as names
from tracefleet.images.build import ImageBuildError, build_all, default_base, image_names, plan
from tracefleet.runner.containers.runtime import ContainerError, require_runtime


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Build tracefleet's images from this checkout: REGISTRY/tracefleet:TAG (the capture proxy, sealer and "
        "evaluator Jobs), REGISTRY/tracefleet-operator:TAG (that image plus the operator's packages) and "
        "REGISTRY/harness-PRESET:TAG for each harness CLI (that image plus the pinned CLI). The Helm chart's "
        "image.registry and image.tag name the same images."
    )
    parser.epilog = ("examples:\n  tracefleet images build\n"
                     "  tracefleet images build --registry registry.example.com/team --tag dev --push\n"
                     "  tracefleet images build --only tracefleet --only tracefleet-operator --base python:3.12-slim\n"
                     "  tracefleet images list --registry registry.example.com/team")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, text in (("build", "build the images (and push them with --push)"),
                         ("list", "print the names `build` would tag, one a line")):
        p = sub.add_parser(action, help=text, description=text)
        p.add_argument("--registry", default=names.DEFAULT_REGISTRY,
                       help=f"registry and path the images are named under (default {names.DEFAULT_REGISTRY})")
        p.add_argument("--tag", default=None, help="the images' tag (default: this tracefleet's version)")
        p.add_argument("--only", action="append", default=[], metavar="NAME", choices=image_names(),
                       help=f"build only this image (repeatable): {', '.join(image_names())}")
        if action == "build":
            p.add_argument("--base", default=None,
                           help="base image of the tracefleet image, any Debian-based one (default: "
                           "localhost/debian:bookworm when present, else debian:bookworm-slim)")
            p.add_argument("--push", action="store_true", help="push each image after building it")
            p.add_argument("--no-cache", action="store_true",
                           help="rebuild every layer (a fresh base's security updates, fresh dependencies)")
            p.add_argument("--logs", type=Path, metavar="DIR", help="keep each build's full log in DIR")


def main(args: argparse.Namespace) -> int:
    tag = args.tag or names.release_tag()
    if args.action == "list":
        for ref in plan(args.registry, tag, "", args.only).refs():
            print(ref)
        return 0
    try:
        runtime = require_runtime()
        base = args.base or default_base(runtime)
        images = plan(args.registry, tag, base, args.only)
        start = time.monotonic()
        print(f"building {len(images.refs())} image(s) with {runtime.name}, base {base}", flush=True)
        build_all(runtime, images, push=args.push, no_cache=args.no_cache, log_dir=args.logs, say=lambda line: print(line, flush=True))
    except (ContainerError, ImageBuildError) as err:
        raise SystemExit(str(err)) from None
    print(f"done in {time.monotonic() - start:.0f} s")
    return 0
