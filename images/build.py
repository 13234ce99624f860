"""Build the images the chart and the operator name (tracefleet.contract.images), from this source checkout.

The tracefleet image installs a wheel of this checkout built here (`pip wheel`, with a fixed SOURCE_DATE_EPOCH so
an unchanged tree gives the same bytes and the layer stays cached) over a layer of its dependencies: the
project's own plus the `IMAGE_EXTRAS`, at the versions installed in the environment running this command (the
versions the tests ran with), so a change to the code rebuilds only the last layer. The operator image is the
same Dockerfile's `operator` stage: the same layers plus the `OPERATOR_EXTRAS` (kopf and the Kubernetes client,
which only the operator imports) below the wheel, so the pods of a job pull the smaller image, a node holding both
stores the shared layers once, and a change to the code rebuilds the wheel's layer alone in both. Each harness
image is the tracefleet image plus one harness bundle (tracefleet.runner.containers.bundle) made from the pinned
CLI that hack/setup.d/50-harnesses.sh installed and the Node.js on this machine's PATH: the host must be Linux on
the images' architecture, with a Node.js built for glibc (the official builds and Debian's are).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from tracefleet.contract import environment
from tracefleet.contract import images as names
from tracefleet.runner.containers.bundle import make_bundle
from tracefleet.runner.containers.runtime import ContainerError, ContainerRuntime, last_line
from tracefleet.runner.presets.base import harness_cache_dir, harness_pins

REPO = Path(__file__).resolve().parents[1]
DOCKERFILES = Path(__file__).resolve().parent  # images/<name>/Dockerfile, beside this builder
# What the tracefleet image runs besides the proxy and the runner: pytest for the `tests` evaluator's default command
# (evaluator Jobs run in this image when a job names no image).
IMAGE_EXTRAS = ("local",)
OPERATOR_EXTRAS = ("operator",)  # the operator image's layer over the tracefleet image's dependencies
# The base when none is given: the one these registry-free machines make (hack/setup.d/55-containers.sh) when
# the runtime has it, else Debian's from Docker Hub. Any Debian-based image works, also one with its own Python
# (python:3.12-slim): the Dockerfile installs Debian's python3 only when the base has none.
LOCAL_BASE = "localhost/debian:bookworm"
PUBLIC_BASE = "docker.io/library/debian:bookworm-slim"
REPRODUCIBLE_EPOCH = "315532800"  # 1980-01-01, the earliest date a zip entry holds
BUILD_TIMEOUT_S = 1800
PIP_CERT_SECRET = "pip-cert"  # the build secret images/tracefleet/Dockerfile mounts for pip


class ImageBuildError(RuntimeError):
    """One line: which image and the build's last error line."""


@dataclass(frozen=True)
class ImagePlan:
    """Which images one build makes, under which names."""

    registry: str
    tag: str
    base: str
    harnesses: tuple[str, ...]  # presets whose harness image is built
    tracefleet: bool = True
    operator: bool = True

    def ref(self, name: str) -> str:
        return names.image_ref(self.registry, name, self.tag)

    def tracefleet_ref(self) -> str:
        return self.ref(names.TRACEFLEET)

    def operator_ref(self) -> str:
        return self.ref(names.OPERATOR)

    def harness_ref(self, preset: str) -> str:
        return self.ref(names.harness_image_name(preset))

    def refs(self) -> list[str]:
        return ([self.tracefleet_ref()] * self.tracefleet + [self.operator_ref()] * self.operator
                + [self.harness_ref(p) for p in self.harnesses])


def harness_presets() -> tuple[str, ...]:
    """The presets that get an image: each pinned harness CLI (runner/presets/pins.json)."""
    return tuple(harness_pins())


def image_names() -> list[str]:
    """Every image name `build` can make, as `--only` takes them."""
    return [names.TRACEFLEET, names.OPERATOR, *(names.harness_image_name(p) for p in harness_presets())]


def plan(registry: str, tag: str, base: str, only: Iterable[str] = ()) -> ImagePlan:
    """The images to build (`only`: names from `image_names()`; empty: all of them). A harness image is built over
    the tracefleet image of the same registry and tag, so asking for one alone still needs that image here."""
    wanted = list(only) or image_names()
    unknown = [w for w in wanted if w not in image_names()]
    if unknown:
        raise ImageBuildError(f"unknown image {', '.join(unknown)}: one of {', '.join(image_names())}")
    presets = tuple(p for p in harness_presets() if names.harness_image_name(p) in wanted)
    return ImagePlan(registry=registry, tag=tag, base=base, harnesses=presets, tracefleet=names.TRACEFLEET in wanted,
                     operator=names.OPERATOR in wanted)


def default_base(runtime: ContainerRuntime) -> str:
    return LOCAL_BASE if runtime.image_exists(LOCAL_BASE) else PUBLIC_BASE


@dataclass(frozen=True)
class Built:
    ref: str
    seconds: float
    pushed: bool = False

    def line(self) -> str:
        return f"{self.ref}: built in {self.seconds:.1f} s" + (", pushed" if self.pushed else "")


def build_all(runtime: ContainerRuntime, p: ImagePlan, *, push: bool = False, no_cache: bool = False,
              log_dir: Path | None = None, say: Callable[[str], None] = print) -> list[Built]:
    """Build (and with `push`, push) every image of the plan, the tracefleet image first (the harness images are
    built over it)."""
    # a rebuild moves a tag; the image it named would stay behind untagged (about 1 GB each)
    before = {ref: runtime.image_id(ref) for ref in p.refs()}
    try:
        return _built(runtime, p, ["--no-cache"] if no_cache else [], push, log_dir, say)
    finally:
        _remove_replaced(runtime, before)


def _built(runtime: ContainerRuntime, p: ImagePlan, flags: list[str], push: bool, log_dir: Path | None,
           say: Callable[[str], None]) -> list[Built]:
    work = environment.cache_dir() / "images"
    done: list[Built] = []
    if p.tracefleet or p.operator:  # two stages of one Dockerfile, one context
        context = _tracefleet_context(work / "tracefleet")
        for wanted, ref, stage in ((p.tracefleet, p.tracefleet_ref(), "tracefleet"),
                                   (p.operator, p.operator_ref(), "operator")):
            if wanted:
                done.append(_one(runtime, ref, "tracefleet", context, {"BASE": p.base}, push, log_dir, say,
                                 [*flags, "--target", stage, *_pip_cert_secret()]))
    if p.harnesses and not runtime.image_exists(p.tracefleet_ref()):
        raise ImageBuildError(f"the harness images are built over {p.tracefleet_ref()}, which is not here: "
                              f"build it too (--only {names.TRACEFLEET} ...)")
    for preset in p.harnesses:
        context = _harness_context(work, preset)
        done.append(_one(runtime, p.harness_ref(preset), "harness", context,
                         {"TRACEFLEET_IMAGE": p.tracefleet_ref()}, push, log_dir, say, flags))
    return done


def _remove_replaced(runtime: ContainerRuntime, before: dict[str, str | None]) -> None:
    """Remove the images a build took the tags of, the harness images before the tracefleet image they were built
    over; one a container or another tag still holds stays (the runtime refuses)."""
    for ref, old in reversed(before.items()):
        if old is not None and runtime.image_id(ref) != old:
            runtime.run("rmi", old, check=False, timeout=120)


def _pip_cert_secret() -> list[str]:
    """The host's CA bundle for the image's pip (PIP_CERT: a machine behind a TLS-intercepting proxy), as a build
    secret, so it reaches no layer."""
    cert = os.environ.get("PIP_CERT")
    return ["--secret", f"id={PIP_CERT_SECRET},src={cert}"] if cert and Path(cert).is_file() else []


def _one(runtime: ContainerRuntime, ref: str, dockerfile: str, context: Path, args: dict[str, str], push: bool,
         log_dir: Path | None, say: Callable[[str], None], extra: list[str] | None = None) -> Built:
    start = time.monotonic()
    argv = ["build", "-t", ref, "-f", str(DOCKERFILES / dockerfile / "Dockerfile"), *(extra or [])]
    for key, value in args.items():
        argv += ["--build-arg", f"{key}={value}"]
    proc = runtime.call(*argv, str(context), timeout=BUILD_TIMEOUT_S)
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"{ref.rsplit('/', 1)[-1].replace(':', '_')}.build.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise ImageBuildError(f"{ref}: {runtime.name} build failed: {last_line(proc.stderr or proc.stdout)}")
    if push:
        try:
            runtime.run("push", ref, timeout=BUILD_TIMEOUT_S)
        except ContainerError as err:
            raise ImageBuildError(f"{ref}: {err}") from None
    built = Built(ref, time.monotonic() - start, push)
    say(built.line())
    return built


def _fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _tracefleet_context(folder: Path) -> Path:
    """The wheel of this checkout, requirements.txt (the dependencies of the image's extras) and constraints.txt
    (this environment's versions of everything installed), and the same two for the operator's extras."""
    _fresh(folder)
    if not (REPO / "pyproject.toml").is_file():
        raise ImageBuildError(f"no source checkout at {REPO}: `tracefleet images build` runs from a clone of the repository")
    source = _source_copy(folder / ".source")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(folder), str(source)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "SOURCE_DATE_EPOCH": REPRODUCIBLE_EPOCH}, cwd=source)
    shutil.rmtree(source)
    if proc.returncode != 0:
        raise ImageBuildError(f"pip wheel of {REPO} failed: {last_line(proc.stderr or proc.stdout)}")
    (folder / "requirements.txt").write_text("\n".join(image_requirements()) + "\n")
    (folder / "constraints.txt").write_text("\n".join(installed_versions()) + "\n")
    operator = extra_requirements(OPERATOR_EXTRAS)
    (folder / "operator-requirements.txt").write_text("\n".join(operator) + "\n")
    (folder / "operator-constraints.txt").write_text("\n".join(installed_versions(operator)) + "\n")
    return folder


def _source_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked, and new ones not ignored): setuptools packs whatever its
    build/ folder holds, so a wheel built in the checkout could carry a module deleted since."""
    proc = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                          capture_output=True, timeout=120)
    if proc.returncode != 0:
        raise ImageBuildError(f"git ls-files in {REPO} failed: {last_line(proc.stderr.decode())} (the images are "
                              "built from a git checkout)")
    for name in proc.stdout.decode().split("\0"):
        path = REPO / name
        if name and path.is_file():  # a deleted, not yet committed file is listed but gone
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / name)
    return dest


def image_requirements() -> list[str]:
    """The tracefleet image's: the project's dependencies and the `IMAGE_EXTRAS`."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *extra_requirements(IMAGE_EXTRAS)]


def extra_requirements(extras: Iterable[str]) -> list[str]:
    wanted = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return [req for extra in extras for req in wanted[extra]]


def installed_versions(requirements: list[str] | None = None) -> list[str]:
    """`name==version` of every distribution the requirements pull in, as installed here (the closure over each
    distribution's own requirements, markers evaluated for this interpreter): what else is installed here does
    not change the list, so the dependency layer stays cached. Local builds (`+local`) are left out: no index has
    them."""
    from packaging.requirements import Requirement  # transformers' and huggingface-hub's dependency

    pins: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()  # (distribution, extra) already walked
    todo = [(Requirement(r), "") for r in (image_requirements() if requirements is None else requirements)]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue  # not installed here: pip resolves it in the image
        name = dist.metadata["Name"]
        if "+" not in dist.version:
            pins[name.lower()] = f"{name}=={dist.version}"
        for wanted in ("", *sorted(req.extras)):
            if (name.lower(), wanted) not in seen:
                seen.add((name.lower(), wanted))
                todo += [(Requirement(r), wanted) for r in dist.requires or ()]
    return sorted(pins.values())


def _harness_context(work: Path, preset: str) -> Path:
    """The bundle of the pinned CLI and this machine's Node.js, made once per CLI and Node.js version: the runtime's
    layer cache keys a COPY on the files' times too, so a bundle made afresh would rebuild an unchanged image."""
    pin = harness_pins()[preset]
    install = harness_cache_dir() / f"{preset}-{pin.version}"
    if not (install / "node_modules" / ".bin" / pin.bin).exists():
        raise ImageBuildError(f"{pin.package}@{pin.version} is not installed at {install}: "
                              "run `bash hack/setup.d/50-harnesses.sh` (or `make images`, which runs it)")
    node = shutil.which("node")
    if node is None:
        raise ImageBuildError("no `node` on PATH: the harness bundles carry this machine's Node.js (>= 20.6)")
    node_version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    folder = work / f"{names.harness_image_name(preset)}-{pin.version}-node-{node_version}"
    made = folder / ".made"
    if not made.exists():
        _fresh(folder)
        # hard links, not copies: the context and the installs are both under $TRACEFLEET_CACHE
        make_bundle(folder / "bundle", {preset: install}, Path(node), link=True)
        made.touch()
    return folder
