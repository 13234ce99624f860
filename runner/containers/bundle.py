"""The harness bundle: a harness CLI with its own runtime, in one folder that runs inside any task image it is
copied into (on a cluster: by the harness pod's init container, from the bundle image's BUNDLE_SOURCE_DIR into the
shared volume at BUNDLE_DIR; tracefleet.operator.children.task_image says why an init container).

Layout (paths relative to the bundle):

    bin/node                    the Node.js runtime the CLIs run on
    bin/<command>               one POSIX sh wrapper per command of each CLI (its npm install's node_modules/.bin),
                                running it with bin/node; what the harness's PATH finds first
    lib/<install>/node_modules  each CLI's npm install folder, as `npm install` left it

What it asks of the task image: Linux on the bundle's architecture, `sh`, and the C and C++ runtime a Node.js
build links against (glibc >= 2.28, libstdc++: every Debian/Ubuntu-based image, which Harbor task images are). It
sets no LD_LIBRARY_PATH, so the commands the agent runs see the task image's own libraries, never ours (but a
`node` the agent runs is the bundle's: bin/ comes first on the harness's PATH).

A bundle image holds the bundle at tracefleet.contract.task_image.BUNDLE_SOURCE_DIR (/opt/tracefleet/bundle) and
has `sh` and `cp`, e.g.

    FROM debian:bookworm-slim
    COPY bundle/ /opt/tracefleet/bundle/

with `bundle/` made by `make_bundle(Path("bundle"), {"codex": Path("codex-install")})`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


NODE = "node"


def _wrapper(target: str, node_script: bool) -> str:
    # `$0` is the wrapper, wherever the bundle was copied: the bundle finds itself from there.
    run = f'"$here/{NODE}" "$here/../{target}"' if node_script else f'"$here/../{target}"'
    return f'#!/bin/sh\nhere=$(dirname "$0")\nexec {run} "$@"\n'


def _is_node_script(path: Path) -> bool:
    with path.open("rb") as f:
        first = f.readline(200)
    return first.startswith(b"#!") and b"node" in first or path.suffix in (".js", ".mjs", ".cjs")


def make_bundle(dest: Path, installs: dict[str, Path], node: Path | None = None, *, link: bool = False) -> list[str]:
    """Make the bundle in `dest` from npm install folders (name -> the folder holding node_modules/) and a Node.js
    binary (default: the `node` on PATH); the commands it offers, sorted. `link` hard-links the installs' files
    instead of copying them (same filesystem; a bundle image's build context, a test)."""
    node = node or Path(shutil.which(NODE) or NODE)
    if not node.is_file():
        raise FileNotFoundError(f"no Node.js runtime at {node}")
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(node.resolve(), dest / "bin" / NODE)
    commands: list[str] = []
    for name, install in installs.items():
        lib = dest / "lib" / name
        shutil.copytree(install / "node_modules", lib / "node_modules", symlinks=True, dirs_exist_ok=True,
                        copy_function=os.link if link else shutil.copy2)
        bins = lib / "node_modules" / ".bin"
        for entry in sorted(bins.iterdir()) if bins.is_dir() else []:
            target = Path(os.path.realpath(entry))
            if not target.is_file():
                continue
            wrapper = dest / "bin" / entry.name
            wrapper.write_text(_wrapper(target.relative_to(dest.resolve()).as_posix(), _is_node_script(target)))
            wrapper.chmod(0o755)
            commands.append(entry.name)
    return sorted(commands)
