"""The container runtime: podman (`--runtime runc` and a containers.conf without default ulimits, as these machines
need: ../shared/container-facts.md, hack/setup.d/55-containers.sh) or docker, whichever answers. Every failure is
a `ContainerError` whose message is one line: the command and the runtime's last error line.

Every call can be timed: inside `timed_to(FILE)` each call appends one JSON line to FILE ({"step": the runtime's
subcommand, "s": seconds, "rc": exit status}), so a session says where its time in the runtime went
(tracefleet.runner.containers.place writes its session's to the artifacts' podman-steps.jsonl; bench/containers.py
reads them)."""

from __future__ import annotations

import contextvars
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from tracefleet.contract import environment

CONTAINERS_CONF_ENV = "CONTAINERS_CONF"
BASE_IMAGE = "localhost/debian:bookworm"  # made by hack/setup.d/55-containers.sh (no registry is reachable)


STEPS_FILE = "podman-steps.jsonl"  # in a session's artifacts: its runtime calls, one JSON line each
STEPS_ENV = "TRACEFLEET_CONTAINER_STEPS"
_steps: contextvars.ContextVar[Path | None] = contextvars.ContextVar("tracefleet_runtime_steps", default=None)


@contextmanager
def timed_to(path: Path) -> Iterator[None]:
    """Record every runtime call made in this block (this thread) as a line of `path`."""
    token = _steps.set(path)
    try:
        yield
    finally:
        _steps.reset(token)


def record_step(step: str, seconds: float, rc: int | None = None, **extra: float) -> None:
    """One line in the current `timed_to` file; outside one, in STEPS_ENV's file when the process has it set (every
    call of the process, sessions mixed: what a bench reads of code that times no session), else nowhere."""
    path = _steps.get() or (Path(os.environ[STEPS_ENV]) if os.environ.get(STEPS_ENV) else None)
    if path is not None:
        with path.open("a") as f:
            f.write(json.dumps({"step": step, "s": round(seconds, 4), "rc": rc, **extra}) + "\n")


def _step_name(args: tuple[str, ...]) -> str:
    # `image inspect` and `image exists` are one step each; every other subcommand is its first word
    return " ".join(args[:2]) if args and args[0] == "image" and len(args) > 1 else (args[0] if args else "")


class ContainerError(RuntimeError):
    """One line: what was run and the runtime's own last error line."""


def cache_dir() -> Path:
    return environment.cache_dir()


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


@dataclass(frozen=True)
class ContainerRuntime:
    name: Literal["podman", "docker"]
    argv: tuple[str, ...]  # the runtime and its global flags
    env: dict[str, str] = field(default_factory=dict)  # added to os.environ for every call
    # `podman run` flags of every container a session starts (`cgroup_parent_flags`)
    run_flags: tuple[str, ...] = ()

    def command(self, *args: str) -> list[str]:
        return [*self.argv, *args]

    def call(self, *args: str, timeout: float | None = None, step: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run `<runtime> args...` and return what it did; subprocess.TimeoutExpired past `timeout`. `step` names
        the call in the `timed_to` record (default: its subcommand)."""
        start = time.monotonic()
        rc = None
        try:
            proc = subprocess.run(self.command(*args), capture_output=True, text=True, timeout=timeout,
                                  env={**os.environ, **self.env}, stdin=subprocess.DEVNULL)
            rc = proc.returncode
            return proc
        finally:
            record_step(step or _step_name(args), time.monotonic() - start, rc)

    def run(self, *args: str, timeout: float | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`call`, but past `timeout`, or (with `check`) on a non-zero exit, a one-line ContainerError."""
        try:
            proc = self.call(*args, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise ContainerError(f"{self.name} {args[0]}: no answer within {timeout:g} s") from err
        if check and proc.returncode != 0:
            raise ContainerError(f"{self.name} {args[0]} failed: {last_line(proc.stderr or proc.stdout)}")
        return proc

    def image_id(self, image: str) -> str | None:
        """The id of the image `image` names here, or None when there is none."""
        proc = self.run("image", "inspect", "--format", "{{.Id}}", image, check=False)
        return (proc.stdout.strip() or None) if proc.returncode == 0 else None

    def image_exists(self, image: str) -> bool:
        return self.image_id(image) is not None

    def remove(self, *names: str) -> None:
        """Remove containers by name, whatever state they are in (nothing if they are gone)."""
        if names:
            # podman waits 10 s for a PID 1 that ignores SIGTERM (bash does) unless told not to.
            self.run("rm", "-f", *(("-t", "0") if self.name == "podman" else ()), *names, check=False, timeout=60)


def own_cgroup(proc_cgroup: str) -> str | None:
    """This process's cgroup for the cpu controller (v1) or the unified one (v2), from /proc/self/cgroup's text."""
    found = None
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
        if controllers == "":
            found = path
    return found


def cgroup_parent_flags(manager: str, proc_cgroup: str) -> tuple[str, ...]:
    """`--cgroup-parent` the runner's own cgroup, for podman's cgroupfs manager. Why: podman puts every container
    under one group of its own (/libpod_parent), which the kernel schedules as ONE entity beside each of the
    host's processes; on a busy machine all of a job's containers then share what one host process gets, and
    parallel sessions in containers ran 2-4x slower than on the host while alone they ran as fast. Beside the
    runner, each container is a group of its own among the host's processes, as a host session's harness is.
    (The systemd manager takes slices, not paths: left as it is.)"""
    path = own_cgroup(proc_cgroup) if manager == "cgroupfs" else None
    return ("--cgroup-parent", path) if path else ()


def _podman() -> ContainerRuntime | None:
    if shutil.which("podman") is None:
        return None
    env: dict[str, str] = {}
    conf = os.environ.get(CONTAINERS_CONF_ENV) or str(cache_dir() / "containers" / "containers.conf")
    if Path(conf).is_file():
        env[CONTAINERS_CONF_ENV] = conf
    # runc handles the hybrid cgroup layout of these machines; crun (podman's default) does not.
    argv = ("podman", "--runtime", "runc") if shutil.which("runc") else ("podman",)
    runtime = ContainerRuntime("podman", argv, env)
    info = runtime.run("info", "--format", "{{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}}", check=False, timeout=60)
    if info.returncode != 0:
        return None
    manager = (info.stdout.split() + ["", ""])[1]
    try:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    except OSError:
        proc_cgroup = ""
    return ContainerRuntime("podman", argv, env, cgroup_parent_flags(manager, proc_cgroup))


def _docker() -> ContainerRuntime | None:
    # A docker CLI without a reachable daemon is no runtime (these machines ship the CLI alone).
    if shutil.which("docker") is None:
        return None
    runtime = ContainerRuntime("docker", ("docker",))
    return runtime if runtime.run("info", "--format", "{{.ServerVersion}}", check=False, timeout=30).returncode == 0 else None


def find_runtime() -> ContainerRuntime | None:
    """podman if it works here, else docker if its daemon answers, else None."""
    return _podman() or _docker()


_found: list[ContainerRuntime] = []


def require_runtime() -> ContainerRuntime:
    """find_runtime's, or a one-line ContainerError. A runtime found is kept for the process (every session's
    verifier would otherwise pay a `podman info`); none found is asked again next time."""
    if _found:
        return _found[0]
    runtime = find_runtime()
    if runtime is None:
        raise ContainerError("no container runtime: podman is not installed or does not work, and docker's daemon "
                             "does not answer (install podman: hack/setup.d/55-containers.sh)")
    _found.append(runtime)
    return runtime
