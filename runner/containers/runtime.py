"""The container runtime: podman (`--runtime runc` and a containers.conf without default ulimits, as these machines
need: ../shared/container-facts.md, hack/setup.d/55-containers.sh) or docker, whichever answers. Every failure is
a `ContainerError` whose message is one line: the command and the runtime's last error line."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from tracefleet.contract import environment

CONTAINERS_CONF_ENV = "CONTAINERS_CONF"
BASE_IMAGE = "localhost/debian:bookworm"  # made by hack/setup.d/55-containers.sh (no registry is reachable)


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

    def command(self, *args: str) -> list[str]:
        return [*self.argv, *args]

    def call(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """Run `<runtime> args...` and return what it did; subprocess.TimeoutExpired past `timeout`."""
        return subprocess.run(self.command(*args), capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env}, stdin=subprocess.DEVNULL)

    def run(self, *args: str, timeout: float | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`call`, but past `timeout`, or (with `check`) on a non-zero exit, a one-line ContainerError."""
        try:
            proc = self.call(*args, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise ContainerError(f"{self.name} {args[0]}: no answer within {timeout:g} s") from err
        if check and proc.returncode != 0:
            raise ContainerError(f"{self.name} {args[0]} failed: {last_line(proc.stderr or proc.stdout)}")
        return proc

    def image_exists(self, image: str) -> bool:
        return self.run("image", "inspect", "--format", "{{.Id}}", image, check=False).returncode == 0

    def remove(self, *names: str) -> None:
        """Remove containers by name, whatever state they are in (nothing if they are gone)."""
        if names:
            # podman waits 10 s for a PID 1 that ignores SIGTERM (bash does) unless told not to.
            self.run("rm", "-f", *(("-t", "0") if self.name == "podman" else ()), *names, check=False, timeout=60)


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
    return runtime if runtime.run("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False, timeout=60).returncode == 0 else None


def _docker() -> ContainerRuntime | None:
    # A docker CLI without a reachable daemon is no runtime (these machines ship the CLI alone).
    if shutil.which("docker") is None:
        return None
    runtime = ContainerRuntime("docker", ("docker",))
    return runtime if runtime.run("info", "--format", "{{.ServerVersion}}", check=False, timeout=30).returncode == 0 else None


def find_runtime() -> ContainerRuntime | None:
    """podman if it works here, else docker if its daemon answers, else None."""
    return _podman() or _docker()


def require_runtime() -> ContainerRuntime:
    runtime = find_runtime()
    if runtime is None:
        raise ContainerError("no container runtime: podman is not installed or does not work, and docker's daemon "
                             "does not answer (install podman: hack/setup.d/55-containers.sh)")
    return runtime
