"""Nothing of a Harbor job is left once `tracefleet run` ends, however it ends: a job of slow tasks through podman
(Pi in each task's container, the scripted engine), one session at a time so that the next one's container waits,
started ahead, is stopped with Ctrl-C, and another with SIGKILL (nothing of the run is left to clean up: the
containers' reaper does, tracefleet.runner.containers.reaper). Afterwards: no container of the run, running or not,
and none of the run's processes. The normal end is tests/containers/test_harbor_run.py's (no container is left)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fixtures.harbor_tasks import write_task
from fixtures.harnesses import harness_binary_path
from fixtures.process_tree import alive, descendants
from tracefleet.engine.scripted import Script, ScriptRoute
from tracefleet.runner.containers.place import CONTAINER_PREFIX
from tracefleet.runner.containers.runtime import BASE_IMAGE, ContainerRuntime
from tracefleet.runner.containers.verifier import VERIFIER_PREFIX


def session_containers(runtime: ContainerRuntime) -> list[str]:
    """The containers of sessions: the agents' (tracefleet-session-*) and their verifiers' (tracefleet-verify-*)."""
    names = runtime.run("ps", "-a", "--format", "{{.Names}}").stdout.split()
    return [n for n in names if n.startswith((CONTAINER_PREFIX, VERIFIER_PREFIX))]


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_a_harbor_run_stopped_leaves_no_container_and_no_process(how: signal.Signals, container_runtime: ContainerRuntime,
                                                                  scripted_engine: Any, tmp_path: Path) -> None:
    harness_binary_path("pi")
    assert session_containers(container_runtime) == [], "containers of an earlier test are left"
    for i in range(3):
        write_task(tmp_path / "tasks", f"slow-{i}", instruction=f"Wait. [plan:slow]\n",
                   dockerfile=f"FROM {BASE_IMAGE}\nWORKDIR /app\n", env_files={}, test_sh="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
                   test_files={})
    scripted_engine.configure(**Script(routes=[ScriptRoute(marker="[plan:slow]", commands=["sleep 120"], final_text="Done.")],
                                       tool_preference=["bash"], final_text="Done.").model_dump())
    job = {"apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "harbor-leaks"}, "spec": {
        "inference": {"external": {"baseUrl": "http://127.0.0.1:1"}, "capture": {"mode": "server"}},
        "harness": {"preset": "pi", "sessionTimeoutSeconds": 300},
        "tasks": {"samplesPerTask": 1, "harbor": {"uri": "tasks"}},
        "parallelism": 1, "output": {"uri": str(tmp_path / "out")}}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    run = subprocess.Popen([sys.executable, "-m", "tracefleet.cli", "run", "job.yaml", "--engine-url", str(scripted_engine.url),
                            "--work-dir", str(tmp_path / "work")], cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env={**os.environ, "TRACEFLEET_SPOOL": str(tmp_path / "spool")})
    seen: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 300
        while len([n for n in session_containers(container_runtime) if n.startswith(CONTAINER_PREFIX)]) < 2:
            # the session's container, and the next one's, started ahead
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0][-3000:]
            seen |= descendants(run.pid)
            time.sleep(0.5)
        while not [n for n in session_containers(container_runtime) if n.startswith(VERIFIER_PREFIX)]:
            # the session's verifier, started once its harness runs, held until the session ends
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0][-3000:]
            seen |= descendants(run.pid)
            time.sleep(0.5)
        seen |= descendants(run.pid)
        run.send_signal(how)
        output, _ = run.communicate(timeout=120)
        deadline = time.monotonic() + 60
        while (session_containers(container_runtime) or alive(seen)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert session_containers(container_runtime) == [], output[-3000:]
        assert alive(seen) == {}, alive(seen)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(30)
        left = session_containers(container_runtime)
        if left:
            container_runtime.run("rm", "-f", "-t", "0", *left, check=False)
