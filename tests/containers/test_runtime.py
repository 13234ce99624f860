"""The container runtime helper: podman found with the flags these machines need, a docker CLI without a daemon
is no runtime, and every failure is one line."""

from __future__ import annotations

import shutil

import pytest

from tracefleet.runner.containers import runtime as rt
from tracefleet.runner.containers.runtime import BASE_IMAGE, ContainerError, ContainerRuntime


def test_podman_runs_the_base_image_with_runc(container_runtime: ContainerRuntime) -> None:
    assert container_runtime.argv == ("podman", "--runtime", "runc")
    assert container_runtime.env[rt.CONTAINERS_CONF_ENV].endswith("containers/containers.conf")
    out = container_runtime.run("run", "--rm", BASE_IMAGE, "cat", "/etc/debian_version", timeout=120).stdout
    assert out.startswith("12.")


def test_a_failure_is_one_line(container_runtime: ContainerRuntime) -> None:
    with pytest.raises(ContainerError) as err:
        container_runtime.run("run", "--rm", "localhost/no-such-image:1", "true", timeout=120)
    assert "\n" not in str(err.value) and str(err.value).startswith("podman run failed: ")


def test_no_runtime_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without podman, the docker CLI these machines ship has no daemon: that is no runtime either."""
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "podman" else real_which(name, *a, **k))
    assert rt.find_runtime() is None
    monkeypatch.setattr(rt, "_found", [])  # a runtime found earlier in this process is kept
    with pytest.raises(ContainerError) as err:
        rt.require_runtime()
    assert "\n" not in str(err.value) and "no container runtime" in str(err.value)


def test_containers_are_started_beside_the_runner_in_its_cgroup() -> None:
    """Not all under podman's one /libpod_parent group, which the kernel schedules as one entity (rt.cgroup_parent_flags)."""
    v1 = "9:name=systemd:/\n3:cpuset:/\n1:cpu,cpuacct:/jobs/runner\n0::/\n"
    assert rt.cgroup_parent_flags("cgroupfs", v1) == ("--cgroup-parent", "/jobs/runner")
    assert rt.cgroup_parent_flags("cgroupfs", "0::/user.slice/runner\n") == ("--cgroup-parent", "/user.slice/runner")
    assert rt.cgroup_parent_flags("systemd", v1) == ()
