"""Harbor's verifier contract, run so that the agent cannot tamper with it.

Where the tests run: in a FRESH container of the task's own image (never written to by any agent), with the agent's
change set applied: every file, link and folder the session's stopped container added or changed, and every path
it deleted (`change_set`: `podman diff` of the container against its image, the files read through `podman
mount`: a layer diff, no `podman commit`). The same program does it on a cluster (tracefleet.harbor.in_image.
VERIFIER, in the evaluator Job's task-image step); here it runs in `podman run` of the task image. So:
  - everything the agent changed, anywhere in the filesystem (a package it installed, a file under /etc, the
    workspace), is what the tests see (Terminal-Bench tasks check more than one folder), except what the image's
    own programs are: a file or link the image holds under /usr, /bin, /sbin and /lib* stays the image's (an
    agent running as root that replaced /usr/bin/python3, bash or pytest changed nothing the tests run), a new
    program on PATH named like one of the image's is not applied (it would shadow it), nor a Python startup hook
    (*.pth, sitecustomize.py, usercustomize.py) added under /usr. New files elsewhere under /usr are applied (a
    package the agent installed is its work; a tool it installed that the tests then run is the agent's, as in
    Harbor);
  - no process of the agent survives into the verifier's container: a background job the agent left cannot
    rewrite the reward or the tests while test.sh runs;
  - the verifier's container gets its own mounts, network, limits and environment, set here, none of the agent's:
    task.toml's [environment] cpus and memory_mb and the [verifier] phase's network (tracefleet.runner.containers.
    place.container_limits), [environment].env then [verifier].env, [verifier].user (the change set is applied
    as root, test.sh runs as the user), under [verifier].timeout_sec.
What this costs: a service the agent started and left running is not running any more when the tests run (a
test.sh that needs one starts it, as Harbor's separate-verifier mode expects).

What else the agent could plant, and what stops it:
  - /logs/verifier/reward.txt or reward.json written by the agent: /logs/verifier is a new empty folder on the
    host, mounted over whatever the image holds there (the change set never carries it); the reward is read from
    that host folder, never from the container's files or from anything test.sh prints.
  - tests/ edited (or /tests/test.sh replaced, a helper added): /tests is a fresh copy of the task folder's
    tests/, the change set never carries /tests, and the agent never saw the tests either.
  - a pytest.py (or any module named like what the tests import), sitecustomize.py or usercustomize.py left in
    the working directory: test.sh runs with PYTHONSAFEPATH=1 (Python >= 3.11: neither `python -m` nor a script
    puts the working directory or the script's folder first on sys.path) and PYTHONNOUSERSITE=1, so
    `python3 -m pytest` imports the real pytest. A test that imports the agent's code names the folder itself
    (sys.path.insert, or PYTHONPATH in [verifier].env).
  - a pytest.ini or conftest.py in the working directory: pytest reads its configuration and initial conftest
    files from the test paths it is given (/tests, as Harbor's test.sh gives them) and their parents, not from
    the working directory. (A test.sh that runs pytest on the working directory itself chooses to read the
    agent's conftest.py.)
  - test.sh running past [verifier].timeout_sec: killed and fail-closed as "timeout", even if a reward was
    written before.
Not run: Harbor's separate verifier environment ([verifier.environment], a verifier image of its own with declared
artifacts): such a task is refused at load (tracefleet.harbor.folders), not judged the shared way.

The verdict (tracefleet.contract.harbor.HarborVerdict): reward.json is read when present (as Harbor does),
else reward.txt. The training reward is reward.txt's one number, or reward.json's "reward" metric; every metric
is kept. Fail-closed (reward 0.0, with the reason): no reward file ("no_reward", also a reward.json without a
"reward" metric), a reward that is not one finite number or a JSON object of them ("unreadable_reward"), the
timeout ("timeout"), a container that could not run ("error").
"""

from __future__ import annotations

import math
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from tracefleet.contract import podenv
from tracefleet.contract import taskimage as ti
from tracefleet.contract.environment import HARDENED_PYTHON_ENV
from tracefleet.contract.harbor import (CONTAINER_TESTS_DIR, CONTAINER_VERIFIER_LOGS, REWARD_JSON, REWARD_TXT,
                                         HarborVerdict)
from tracefleet.harbor.folders import HarborTask
from tracefleet.harbor.in_image import VERIFIER

from tracefleet.runner.containers.harbor_outcome import harbor_verdict, verdict_here
from tracefleet.runner.containers.place import container_limits
from tracefleet.runner.containers.runtime import ContainerRuntime, last_line

PODMAN_FAILED = 125  # `podman run`'s own failure (image missing, bad mount), not test.sh's
# On top of [verifier].timeout_sec, for applying the change set and the container's start and removal; past it the
# container is removed and the verdict is a timeout.
APPLY_MARGIN_S = 120
def verify(runtime: ContainerRuntime, task: HarborTask, image: str, *, changes: Path | None = None,
           workdir: str | None = None, log_dir: Path | None = None) -> HarborVerdict:
    """Run the task's tests/test.sh in a fresh container of `image` (the task's image) with the agent's change set
    (`changes`: a folder holding tracefleet.runner.containers.changes.change_set's two files; none: the image as
    built) applied, and return the
    verdict. Never raises for what the tests or the agent did: every failure is a fail-closed verdict with its
    reason. `workdir` overrides the working directory (default: task.toml's [environment].workdir, else the
    image's WORKDIR, as Harbor runs test.sh). `log_dir` keeps test.sh's output and the reward files."""
    config = task.config
    verifier = config.verifier
    timeout_s = max(1, math.ceil(verifier.timeout_sec))
    name = f"tracefleet-verify-{uuid.uuid4().hex[:12]}"
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tracefleet-verify-") as tmp:
        eval_dir, tests, logs = Path(tmp) / "eval", Path(tmp) / "tests", Path(tmp) / "logs"
        shutil.copytree(task.tests_dir, eval_dir / ti.EVAL_TESTS, symlinks=True)
        for folder in (tests, logs):
            folder.mkdir()
            folder.chmod(0o777)  # test.sh may run as [verifier].user
        for part in (ti.CHANGES, ti.DELETED):
            if changes is not None and (changes / part).is_file():
                shutil.copyfile(changes / part, eval_dir / part)
        env = {**config.environment.env, **verifier.env, **HARDENED_PYTHON_ENV,
               podenv.VERIFIER_TIMEOUT_S: str(timeout_s)}
        if workdir or config.environment.workdir:
            env[podenv.TASK_WORKDIR] = workdir or config.environment.workdir
        if verifier.user is not None:
            env[ti.VERIFIER_USER_ENV] = str(verifier.user)
        args = ["run", "--rm", "--name", name, "--user", "0", *runtime.run_flags,
                *container_limits(config, "verifier"),
                "-v", f"{eval_dir}:{ti.EVAL_DIR}", "-v", f"{tests}:{CONTAINER_TESTS_DIR}",
                "-v", f"{logs}:{CONTAINER_VERIFIER_LOGS}", "--entrypoint", "sh"]
        for key, value in env.items():
            args += ["-e", f"{key}={value}"]
        args += [image, "-c", VERIFIER]
        try:
            proc = runtime.call(*args, timeout=timeout_s + ti.STOP_GRACE_S + APPLY_MARGIN_S, step="run verifier")
        except subprocess.TimeoutExpired as err:
            runtime.remove(name)
            output = _text(err.stdout) + _text(err.stderr)
            _keep(log_dir, logs, output)
            return harbor_verdict(logs, exit_code=None, output=output, timed_out=True, timeout_s=verifier.timeout_sec,
                                  duration_s=time.monotonic() - start)
        if proc.returncode == PODMAN_FAILED or not (eval_dir / ti.EXIT_CODE).exists() and proc.returncode != 0:
            return harbor_verdict(logs, exit_code=None, output=proc.stdout + proc.stderr, timed_out=False,
                                  timeout_s=verifier.timeout_sec, duration_s=time.monotonic() - start,
                                  error=f"the verifier's container did not run: {last_line(proc.stderr or proc.stdout)}")
        verdict = verdict_here(eval_dir, logs, verifier.timeout_sec)
        _keep(log_dir, logs, verdict.output_tail)
    # the container's whole run (applying the change set too), not test.sh's whole seconds alone
    return verdict.model_copy(update={"duration_s": time.monotonic() - start})


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
