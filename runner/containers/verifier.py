"""Harbor's verifier contract, run so that the agent cannot tamper with it.

Where the tests run: in a FRESH container of the task's own image (never written to by any agent), with the agent's
change set applied: every file, link and folder the session's stopped container added or changed, and every path
it deleted (`change_set`: `podman diff` of the container against its image, the files read through `podman
mount`: a layer diff, no `podman commit`). The same program does it on a cluster (tracefleet.harbor.task_image_programs.
VERIFIER, in the evaluator Job's task-image step); here it runs in `podman run` of the task image, started while the
agent still works and held before its first step until the change set is in place (`Verifier`: the container's start
is then no part of the session's time; the container holds nothing of the agent's until its go). So:
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
    limits.container_limits), [environment].env then [verifier].env, [verifier].user (the change set is applied
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

import errno
import math
import os
import shutil
import subprocess
import tempfile
import time
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from tracefleet.contract import podenv
from tracefleet.contract import task_image as ti
from tracefleet.contract.environment import HARDENED_PYTHON_ENV
from tracefleet.contract.harbor import (CONTAINER_TESTS_DIR, CONTAINER_VERIFIER_LOGS, REWARD_JSON, REWARD_TXT,
                                         HarborVerdict)
from tracefleet.harbor.folders import HarborTask
from tracefleet.harbor.task_image_programs import VERIFIER

from tracefleet.runner.containers.harbor_outcome import harbor_verdict, verdict_here
from tracefleet.runner.containers.limits import container_limits
from tracefleet.runner.containers.runtime import ContainerRuntime, last_line, record_step

VERIFIER_PREFIX = "tracefleet-verify-"  # the name of every verifier container
PODMAN_FAILED = 125  # `podman run`'s own failure (image missing, bad mount), not test.sh's
# On top of [verifier].timeout_sec, for applying the change set and the container's start and removal; past it the
# container is removed and the verdict is a timeout.
APPLY_MARGIN_S = 120
GO_FIFO = ".go"  # in the verifier's eval folder: the runner writes GO there once the change set is in place
GO, STOP = "go", "stop"
# How long a verifier started ahead waits for its go before it exits on its own (a runner that died): past the
# session's own limit; the container is removed by --rm either way.
READY_MARGIN_S = 600
# Waiting for the verifier's shell to open its FIFO (the container still starting) before the go is given up.
READER_WAIT_S = 120
STOP_WAIT_S = 60  # for a cancelled verifier's container to exit


def write_fifo(fifo: Path, data: bytes, *, alive: Callable[[], bool], wait_s: float) -> bool:
    """Write `data` to a FIFO that a held container reads, once its reader opened it; False when it never did
    (`alive()` said the container is gone, or `wait_s` passed)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as err:
            if err.errno != errno.ENXIO:
                raise
            if not alive() or time.monotonic() > deadline:
                return False
            time.sleep(0.01)
    try:
        os.set_blocking(fd, True)  # all of `data`, however large, while the reader reads it
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:  # the reader went away before it read everything
        return False
    finally:
        os.close(fd)
    return True


class Verifier:
    """A FRESH container of the task's image, started ahead (while the agent still works, so its start is no part of
    the session's time) and held before test.sh: its shell blocks on a FIFO in its eval folder (a host folder no
    agent container mounts) until `judge` has copied the change set there and written GO (`cancel`: STOP, or
    `podman rm` when the shell never opened it). The container holds nothing of the agent's before the go: the
    measures in the module's docstring are the same as for a container started at the verdict. `wait_s` bounds the
    wait (the session's limit and a margin): a runner that died leaves no container behind."""

    def __init__(self, runtime: ContainerRuntime, task: HarborTask, image: str, *, workdir: str | None = None,
                 wait_s: float = READY_MARGIN_S) -> None:
        config = task.config
        self.runtime, self.timeout_s = runtime, max(1, math.ceil(config.verifier.timeout_sec))
        self.name = f"{VERIFIER_PREFIX}{uuid.uuid4().hex[:12]}"
        self.started = time.monotonic()
        self._tmp = tempfile.TemporaryDirectory(prefix="tracefleet-verify-")
        self.eval_dir, tests, self.logs = (Path(self._tmp.name) / d for d in ("eval", "tests", "logs"))
        shutil.copytree(task.tests_dir, self.eval_dir / ti.EVAL_TESTS, symlinks=True)
        for folder in (tests, self.logs):
            folder.mkdir()
            folder.chmod(0o777)  # test.sh may run as [verifier].user
        self.fifo = self.eval_dir / GO_FIFO
        os.mkfifo(self.fifo, 0o600)
        env = {**config.environment.env, **config.verifier.env, **HARDENED_PYTHON_ENV,
               podenv.VERIFIER_TIMEOUT_S: str(self.timeout_s)}
        if workdir or config.environment.workdir:
            env[podenv.TASK_WORKDIR] = workdir or config.environment.workdir
        if config.verifier.user is not None:
            env[ti.VERIFIER_USER_ENV] = str(config.verifier.user)
        args = ["run", "--rm", "--name", self.name, "--user", "0", *runtime.run_flags,
                *container_limits(config, "verifier"),
                "-v", f"{self.eval_dir}:{ti.EVAL_DIR}", "-v", f"{tests}:{CONTAINER_TESTS_DIR}",
                "-v", f"{self.logs}:{CONTAINER_VERIFIER_LOGS}", "--entrypoint", "sh"]
        for key, value in env.items():
            args += ["-e", f"{key}={value}"]
        held = (f"if ! timeout {math.ceil(wait_s)} sh -c 'read w < \"$0\" && [ \"$w\" = {GO} ]' {ti.EVAL_DIR}/{GO_FIFO}; "
                f"then exit 0; fi\n")
        args += [image, "-c", held + VERIFIER]
        self.proc = subprocess.Popen(runtime.command(*args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env={**os.environ, **runtime.env})
        self._go_lock = threading.Lock()
        self._went: bool | None = None  # whether the go reached the held shell; None: not given yet
        self._go_at = 0.0

    def _signal(self, word: str, wait_s: float) -> bool:
        return write_fifo(self.fifo, f"{word}\n".encode(), alive=lambda: self.proc.poll() is None, wait_s=wait_s)

    def judge(self, changes: Path | None = None, log_dir: Path | None = None) -> HarborVerdict:
        """The verdict on `changes` (a folder holding tracefleet.runner.containers.changes.change_set's two files;
        none: the image as built). Never raises for what the tests or the agent did: every failure is a fail-closed
        verdict with its reason. `log_dir` keeps test.sh's output and the reward files."""
        try:
            return self._judge(changes, log_dir)
        finally:
            self._tmp.cleanup()

    def go(self, changes: Path | None) -> None:
        """Hand the change set over and let test.sh run (once: a second call, `judge`'s, finds it done)."""
        with self._go_lock:
            if self._went is None:
                for part in (ti.CHANGES, ti.DELETED):
                    if changes is not None and (changes / part).is_file():
                        shutil.copyfile(changes / part, self.eval_dir / part)
                self._go_at = time.monotonic()
                self._went = self._signal(GO, READER_WAIT_S)

    def _judge(self, changes: Path | None, log_dir: Path | None) -> HarborVerdict:
        self.go(changes)
        go, signalled = self._go_at, bool(self._went)
        limit = self.timeout_s + ti.STOP_GRACE_S + APPLY_MARGIN_S
        try:
            out, err = self.proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            self.runtime.remove(self.name)
            self.proc.kill()
            out, err = self.proc.communicate()
            record_step("run verifier", time.monotonic() - go, None, held=round(go - self.started, 4))
            output = (out or "") + (err or "")
            _keep(log_dir, self.logs, output)
            return harbor_verdict(self.logs, exit_code=None, output=output, timed_out=True,
                                  timeout_s=self.timeout_s, duration_s=time.monotonic() - go)
        record_step("run verifier", time.monotonic() - go, self.proc.returncode, held=round(go - self.started, 4))
        if not signalled or self.proc.returncode == PODMAN_FAILED or \
                not (self.eval_dir / ti.EXIT_CODE).exists() and self.proc.returncode != 0:
            return harbor_verdict(self.logs, exit_code=None, output=out + err, timed_out=False,
                                  timeout_s=self.timeout_s, duration_s=time.monotonic() - go,
                                  error=f"the verifier's container did not run: {last_line(err or out)}")
        verdict = verdict_here(self.eval_dir, self.logs, self.timeout_s)
        _keep(log_dir, self.logs, verdict.output_tail)
        # the container's whole run from the go (applying the change set too), not test.sh's whole seconds alone
        return verdict.model_copy(update={"duration_s": time.monotonic() - go})

    def cancel(self) -> None:
        """No verdict wanted (the session failed): the held shell exits (its container goes with --rm)."""
        try:
            if not self._signal(STOP, READER_WAIT_S) and self.proc.poll() is None:
                self.runtime.remove(self.name)
            self.proc.communicate(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        finally:
            self._tmp.cleanup()


# Verifiers started ahead, by the session's artifacts folder: the place starts one, the harbor evaluator takes it
# (both in this process), the place cancels one nobody took.
_held: dict[Path, Future[Verifier]] = {}
_held_lock = threading.Lock()


def hold(key: Path, start: Callable[[], Verifier]) -> None:
    """Start a Verifier (`start`, in a thread of its own) for the session whose artifacts are `key`."""
    future: Future[Verifier] = Future()

    def run() -> None:
        try:
            future.set_result(start())
        except BaseException as exc:  # noqa: BLE001 - the evaluator starts its own then
            future.set_exception(exc)

    with _held_lock:
        _held[key] = future
    threading.Thread(target=run, name="tracefleet-verifier", daemon=True).start()


def take(key: Path) -> Verifier | None:
    """The Verifier held for `key`, or None (none held, or it did not start: the caller starts one)."""
    with _held_lock:
        future = _held.pop(key, None)
    try:
        return None if future is None else future.result()
    except Exception:  # noqa: BLE001
        return None


def go_ahead(key: Path, changes: Path) -> None:
    """Give the Verifier held for `key` its go now (in the background), `changes` being complete: test.sh runs while
    the session finishes collecting; `take` and `judge` then only wait for the verdict."""
    with _held_lock:
        future = _held.get(key)
    if future is not None:
        future.add_done_callback(lambda f: f.exception() is None and threading.Thread(
            target=f.result().go, args=(changes,), name="tracefleet-verifier-go", daemon=True).start())


def release(key: Path) -> None:
    """Cancel the Verifier held for `key` if nobody took it (in the background: a session's end does not wait)."""
    with _held_lock:
        future = _held.pop(key, None)
    if future is not None:
        future.add_done_callback(lambda f: f.exception() is None and threading.Thread(
            target=f.result().cancel, name="tracefleet-verifier-cancel", daemon=True).start())


def verify(runtime: ContainerRuntime, task: HarborTask, image: str, *, changes: Path | None = None,
           workdir: str | None = None, log_dir: Path | None = None) -> HarborVerdict:
    """Run the task's tests/test.sh in a fresh container of `image` (the task's image) with the agent's change set
    (`changes`: a folder holding tracefleet.runner.containers.changes.change_set's two files; none: the image as
    built) applied, and return the verdict (Verifier, started now). `workdir` overrides the working directory
    (default: task.toml's [environment].workdir, else the image's WORKDIR, as Harbor runs test.sh)."""
    return Verifier(runtime, task, image, workdir=workdir).judge(changes, log_dir)


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
