"""Nothing of a job outlives `tracefleet run`, however it ends: killed with SIGKILL (nothing of it runs to stop
anything), the CPU engine it started and the harness of the session it was running are gone within seconds (they
die with their parent: PR_SET_PDEATHSIG, tracefleet.process_group.die_with_parent). Ctrl-C and a normal end are
tests/runner/test_runner_local.py's; a Harbor job's containers, tests/containers/test_harbor_run.py's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from fixtures.command_harness import MODEL_CALL
from fixtures.local_runs import CALC
from fixtures.process_tree import alive, descendants

def test_a_run_killed_with_sigkill_leaves_no_engine_and_no_harness(tmp_path: Path) -> None:
    (tmp_path / "harness.py").write_text(MODEL_CALL + "\nimport time\ntime.sleep(300)\n")
    job = {"apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "leak"}, "spec": {
        "harness": {"preset": "command", "command": ["python", "{job_dir}/harness.py"], "sessionTimeoutSeconds": 600},
        "tasks": {"samplesPerTask": 1, "inline": [{"id": "t", "prompt": "say hi", "workspace": {"repo": str(CALC)}}]},
        "evaluator": {"preset": "command", "timeoutSeconds": 30, "command": ["true"]},
        "inference": {"managed": {"model": "smollm2"}},  # no engine URL: the run starts its CPU engine
        "output": {"uri": str(tmp_path / "out")}}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    run = subprocess.Popen([sys.executable, "-m", "tracefleet.cli", "run", str(tmp_path / "job.yaml"), "--work-dir",
                            str(tmp_path / "work")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           cwd=tmp_path, env={**os.environ, "TRACEFLEET_SPOOL": str(tmp_path / "spool")})
    below: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 240
        while not any("harness.py" in cmd for cmd in below.values()):
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0][-3000:]
            time.sleep(0.5)
            below = descendants(run.pid)
        assert any(" engine --backend llama" in cmd for cmd in below.values()), below
        run.send_signal(signal.SIGKILL)
        run.wait(30)
        deadline = time.monotonic() + 15
        while alive(below) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert alive(below) == {}, f"left behind after SIGKILL of tracefleet run: {alive(below)}"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(30)
        for pid in alive(below):
            os.kill(pid, signal.SIGKILL)
