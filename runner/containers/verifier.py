"""Harbor's verifier contract, run so that the agent cannot tamper with it.

Where the tests run: in a FRESH container of a snapshot of the session's container, taken after the agent stopped
(`snapshot`: `podman commit` of the stopped container). Not in the session's own container, and not in a fresh
container of the task image with only the workspace diff applied:
  - a snapshot carries everything the agent changed, anywhere in the filesystem (a package it installed, a file
    it wrote under /etc or /usr, the workspace), which is what Harbor tasks are judged on (Terminal-Bench tasks
    check more than one folder); a workspace diff would lose all of that;
  - no process of the agent survives into the verifier's container: a background job the agent left cannot
    rewrite the reward or the tests while test.sh runs, which it could in the session's own container (where
    emptying /logs/verifier first, as NeMo Gym does, still leaves that race open);
  - the verifier's container gets its own mounts, network and environment, set here, none of them the agent's.
What this costs: a service the agent started and left running is not running any more when the tests run (a
test.sh that needs one starts it, as Harbor's separate-verifier mode expects). State that lives outside the
container's filesystem (a workspace bind-mounted from the host) is not in a snapshot: pass it as `mounts`.

What the agent could plant, and what stops it:
  - /logs/verifier/reward.txt or reward.json written by the agent: /logs/verifier is a new empty folder on the
    host, mounted over whatever the snapshot holds there; the reward is read from that host folder, never from
    the container's files or from anything test.sh prints.
  - tests/ edited (or /tests/test.sh replaced, a helper added): /tests is a fresh copy of the task folder's
    tests/ on the host, mounted over the snapshot's /tests. The task's tests are never inside the session's
    container, so the agent never saw them either.
  - a pytest.py (or any module named like what the tests import), sitecustomize.py or usercustomize.py left in
    the working directory: test.sh runs with PYTHONSAFEPATH=1 (Python >= 3.11: neither `python -m` nor a script
    puts the working directory or the script's folder first on sys.path) and PYTHONNOUSERSITE=1, so
    `python3 -m pytest` imports the real pytest. A test that imports the agent's code names the folder itself
    (sys.path.insert, or PYTHONPATH in [verifier].env).
  - a pytest.ini or conftest.py in the working directory: pytest reads its configuration and initial conftest
    files from the test paths it is given (/tests, as Harbor's test.sh gives them) and their parents, not from
    the working directory; with /tests mounted fresh there is none the agent wrote. (A test.sh that runs
    pytest on the working directory itself chooses to read the agent's conftest.py.)
  - test.sh running past [verifier].timeout_sec: killed (the container removed) and fail-closed as "timeout",
    even if a reward was written before.
Not prevented here: an agent running as root can replace the image's own programs (python3, pytest, bash) in
the snapshot. Tests that must not trust the agent's filesystem at all need Harbor's separate verifier
environment ([verifier].environment), which this function does not run yet.

The verdict (tracefleet.contract.harbor.HarborVerdict): reward.json is read when present (as Harbor does),
else reward.txt. The training reward is reward.txt's one number, or reward.json's "reward" metric; every metric
is kept. Fail-closed (reward 0.0, with the reason): no reward file ("no_reward", also a reward.json without a
"reward" metric), a reward that is not one finite number or a JSON object of them ("unreadable_reward"), the
timeout ("timeout"), a container that could not run ("error").
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from tracefleet.contract.harbor import (CONTAINER_TESTS_DIR, CONTAINER_VERIFIER_LOGS, REWARD_JSON, REWARD_TXT, TEST_SCRIPT,
                                         HarborVerdict)
from tracefleet.harbor.folders import HarborTask

from tracefleet.runner.containers.harbor_outcome import harbor_verdict
from tracefleet.harbor.image_names import repository_name
from tracefleet.runner.containers.runtime import ContainerRuntime, last_line
from tracefleet.contract.environment import HARDENED_PYTHON_ENV

SNAPSHOT_REPOSITORY = "localhost/tracefleet-verify"
PODMAN_FAILED = 125  # `podman run`'s own failure (image missing, bad mount), not test.sh's


def snapshot(runtime: ContainerRuntime, container: str) -> str:
    """The session container's whole filesystem, as the agent left it, committed to an image to verify in."""
    image = f"{SNAPSHOT_REPOSITORY}/{repository_name(container)}:latest"
    runtime.run("commit", container, image, timeout=600)
    return image


def verify(runtime: ContainerRuntime, task: HarborTask, image: str, *, mounts: tuple[tuple[Path, str], ...] = (),
           workdir: str | None = None, log_dir: Path | None = None) -> HarborVerdict:
    """Run the task's tests/test.sh in a fresh container of `image` (the `snapshot` of the session's container)
    and return the verdict. Never raises for what the tests or the agent did: every failure is a fail-closed
    verdict with its reason. `workdir` overrides the working directory (default: task.toml's
    [environment].workdir, else the image's WORKDIR, as Harbor runs test.sh). `log_dir` keeps test.sh's output
    and the reward files."""
    verifier = task.config.verifier
    environment = task.config.environment
    name = f"tracefleet-verify-{uuid.uuid4().hex[:12]}"
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tracefleet-verify-") as tmp:
        tests, logs = Path(tmp) / "tests", Path(tmp) / "logs"
        shutil.copytree(task.tests_dir, tests, symlinks=True)
        logs.mkdir()
        logs.chmod(0o777)  # the verifier may run as a user ([verifier].user)
        args = ["run", "--rm", "--name", name, "-v", f"{tests}:{CONTAINER_TESTS_DIR}",
                "-v", f"{logs}:{CONTAINER_VERIFIER_LOGS}", "--entrypoint", "bash"]
        for host, path in mounts:
            args += ["-v", f"{host}:{path}"]
        if (verifier.network_mode or environment.network_mode) == "no-network":
            args += ["--network", "none"]
        if verifier.user is not None:
            args += ["--user", str(verifier.user)]
        if workdir or environment.workdir:
            args += ["--workdir", workdir or environment.workdir]
        for key, value in {**environment.env, **verifier.env, **HARDENED_PYTHON_ENV}.items():
            args += ["-e", f"{key}={value}"]
        args += [image, f"{CONTAINER_TESTS_DIR}/{TEST_SCRIPT}"]
        try:
            proc = runtime.call(*args, timeout=verifier.timeout_sec)
        except subprocess.TimeoutExpired as err:
            runtime.remove(name)
            output = _text(err.stdout) + _text(err.stderr)
            _keep(log_dir, logs, output)
            return harbor_verdict(logs, exit_code=None, output=output, timed_out=True,
                                  timeout_s=verifier.timeout_sec, duration_s=time.monotonic() - start)
        output = proc.stdout + proc.stderr
        _keep(log_dir, logs, output)
        verdict = harbor_verdict(logs, exit_code=proc.returncode, output=output, timed_out=False,
                                 timeout_s=verifier.timeout_sec, duration_s=time.monotonic() - start)
    if verdict.status == "no_reward" and not verdict.metrics and proc.returncode == PODMAN_FAILED:
        # test.sh never ran (no exit status of its own): the runtime's failure, not the agent's (harbor_outcome.outcome_status)
        return verdict.model_copy(update={"status": "error", "exit_code": None,
                                          "reason": f"the verifier's container did not run: {last_line(proc.stderr)}"})
    return verdict


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _keep(log_dir: Path | None, logs: Path, output: str) -> None:
    if log_dir is None:
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "test-output.txt").write_text(output)
    for name in (REWARD_TXT, REWARD_JSON):
        if (logs / name).is_file():
            shutil.copyfile(logs / name, log_dir / name)
