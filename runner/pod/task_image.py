"""The session program's place in a harness pod that runs a task's own image (a Harbor task on a cluster).

Where the session program runs: in a container of the tracefleet image ("session"), beside the task-image
container ("harness") that runs the harness. Why there, and not inside the task image: the task image has no
Python of ours and must not need any (a bundled interpreter would have to match every task image's libc and would
put our code, and anything that imports from the working directory, into the agent's filesystem); the session
program stays the one program (tracefleet.runner.session.run) and only its place changes. Why a second container
and not the proxy sidecar: the sidecar runs for the pod's whole life and restarts; the session is a run to
completion whose exit status is the pod's outcome, as in every harness pod.

The two containers meet in the shared volume (tracefleet.contract.task_image has the layout): the task
container's launcher (tracefleet.harbor.task_image_programs.LAUNCHER) says it is ready and where its working
directory is; this place writes the launch request (the preset's argv and environment as a shell script, the
workspace path the session program prepared replaced by the task container's working directory: that is where the
agent works), waits for the exit status (writing `stop` at the session timeout or on SIGTERM; the launcher kills
the harness's process group), and puts the agent's change set into the artifacts the sidecar uploads, with the
harness's output. The workspace the session program prepares here stays empty: the task's files are the image's.
"""

from __future__ import annotations

import shlex
import shutil
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path

from tracefleet.contract import task_image as ti
from tracefleet.contract.session import SessionPlan, SessionResult
from tracefleet.runner.pod.harness_pod import PodPlace
from tracefleet.runner.sandbox import ProcessResult
from tracefleet.runner.session import SessionFolders
from tracefleet.runner.workspace import tree_patch
from tracefleet.tarballs import extract_member

POLL_S = 0.2
# The launcher lists the root filesystem before it says ready; a slow image pull is the kubelet's (the container
# is not started before its image is there), so this only bounds a launcher that never comes up.
READY_WAIT_S = 120.0
# After a stop: the grace before the KILL, then the change set (find + tar of what the agent touched).
COLLECT_WAIT_S = 120.0


def request_script(argv: list[str], env: Mapping[str, str], *, cwd: str, home: str) -> str:
    """The launch request: a POSIX shell script run by the task container's launcher. The harness's PATH is the
    task image's own with the bundle's bin/ first (the session container's PATH means nothing there)."""
    lines = ["set -e"]
    for key, value in env.items():
        if key == "PATH":
            value = f"{ti.BUNDLE_BIN}:{value}"
        lines.append(f"export {key}={shlex.quote(value)}")
    if "PATH" not in env:
        lines.append(f'export PATH="{ti.BUNDLE_BIN}:$PATH"')
    lines += [f"export HOME={shlex.quote(home)}", f"cd {shlex.quote(cwd)}", "exec " + shlex.join(argv)]
    return "\n".join(lines) + "\n"


class TaskImagePlace(PodPlace):
    """PodPlace with the harness in the task container (see the module's docstring)."""

    def __init__(self, env: Mapping[str, str], stop=None) -> None:  # noqa: ANN001 - PodPlace's
        super().__init__(env, stop)
        assert self.pod.launch_dir is not None, "a task-image place needs the launch folder"
        self.launch = Path(self.pod.launch_dir)

    def user_env(self, plan: SessionPlan) -> dict[str, str]:
        # the task container's own environment is the task image's: only spec.harness.env is the user's here
        return dict(plan.harness.env)

    def _stopping(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def _wait_for(self, name: str, until: float) -> bool:
        while time.monotonic() < until:
            if (self.launch / name).exists():
                return True
            if name == ti.READY and self._stopping():
                return False
            time.sleep(POLL_S)
        return (self.launch / name).exists()

    def _task_workdir(self, wait_s: float) -> str | None:
        """The task container's working directory, once its launcher is up (None: it did not come up)."""
        if not self._wait_for(ti.READY, time.monotonic() + wait_s):
            return None
        return (self.launch / ti.READY).read_text().strip() or "/"

    def harness_workdir(self, plan: SessionPlan, workspace: Path) -> Path:
        """Where the preset is told the harness works (the session program asks places that run the harness
        elsewhere): the task container's working directory; the workspace when the launcher is not up (run says so)."""
        found = self._task_workdir(min(READY_WAIT_S, plan.harness.timeout_s))
        return Path(found) if found else workspace

    def run(self, plan: SessionPlan, argv: list[str], *, cwd: Path, home: Path, env: dict[str, str], timeout_s: float,
            stdout_path: Path, stderr_path: Path) -> ProcessResult:
        started = time.monotonic()
        workdir = self._task_workdir(min(READY_WAIT_S, timeout_s))
        if workdir is None:
            return ProcessResult(exit_code=None, timed_out=False, duration_s=time.monotonic() - started,
                                 stopped=self._stopping(),
                                 start_error=f"the task container's launcher did not start ({self.launch}/{ti.READY})")
        # A session program without the harness_workdir question told the preset the prepared workspace: that path
        # stands for the task container's working directory
        here = str(cwd)

        def there(text: str) -> str:
            return text.replace(here, workdir)

        script = request_script([there(a) for a in argv], {k: there(v) for k, v in env.items()}, cwd=workdir,
                                home=str(home))
        tmp = self.launch / f".{ti.REQUEST}.tmp"
        tmp.write_text(script)
        tmp.replace(self.launch / ti.REQUEST)
        deadline = started + timeout_s
        timed_out = stopped = False
        while not (self.launch / ti.EXIT_CODE).exists():
            if time.monotonic() >= deadline or self._stopping():
                timed_out, stopped = not self._stopping(), self._stopping()
                (self.launch / ti.STOP).touch()
                self._wait_for(ti.EXIT_CODE, time.monotonic() + ti.STOP_GRACE_S + COLLECT_WAIT_S)
                break
            time.sleep(POLL_S)
        for name, dest in ((ti.HARNESS_STDOUT, stdout_path), (ti.HARNESS_STDERR, stderr_path)):
            if (self.launch / name).exists():
                shutil.copyfile(self.launch / name, dest)
        code_file = self.launch / ti.EXIT_CODE
        code = int(code_file.read_text().strip() or -1) if code_file.exists() else None
        return ProcessResult(exit_code=code, timed_out=timed_out, stopped=stopped, duration_s=time.monotonic() - started,
                             stdout_path=stdout_path, stderr_path=stderr_path)

    def workspace_diff(self, plan: SessionPlan, folders: SessionFolders) -> str:
        """What the agent changed in the task container's working directory, against the image's (the launcher's
        copy of it before the harness started, then that copy with the change set applied), as the binary git patch
        `tracefleet run`'s container place makes (session.patch: the diagnostics read it). Empty when the harness
        never ran or the working directory is `/`."""
        before_tar = self.launch / ti.WORKDIR_BEFORE
        workdir = self._task_workdir(0)
        if workdir is None or not before_tar.exists() or not (self.launch / ti.EXIT_CODE).exists():
            return ""
        scratch = folders.work / "container-diff"
        shutil.rmtree(scratch, ignore_errors=True)
        before, after = scratch / "before", scratch / "after"
        try:
            for dest in (before, after):
                dest.mkdir(parents=True)
                _unpack(before_tar, dest)
            prefix = workdir.strip("/")
            deleted = self.launch / ti.DELETED
            for line in deleted.read_text().splitlines() if deleted.exists() else []:
                rel = _under(line.strip("/"), prefix)
                if rel:
                    target = after / rel
                    if target.is_dir() and not target.is_symlink():
                        shutil.rmtree(target)
                    else:
                        target.unlink(missing_ok=True)
            if (self.launch / ti.CHANGES).exists():
                _unpack(self.launch / ti.CHANGES, after, prefix)
            return tree_patch(before, after, scratch / "git")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def finish(self, result: SessionResult, folders: SessionFolders) -> None:
        """The change set into the artifacts (before result.json, which the sidecar takes to mean complete), and
        `done` for a launcher still waiting for a request (the session ended before the harness started)."""
        for name in (ti.CHANGES, ti.DELETED):
            if (self.launch / name).exists():
                shutil.copyfile(self.launch / name, folders.artifacts / name)
        (self.launch / ti.DONE).touch()
        super().finish(result, folders)


def _under(name: str, prefix: str) -> str | None:
    """`name` (a path without its leading /) relative to folder `prefix`; None outside it or for the folder itself."""
    if not prefix:
        return name or None
    if not name.startswith(prefix + "/"):
        return None
    return name[len(prefix) + 1:] or None


def _unpack(tar_path: Path, dest: Path, prefix: str = "") -> None:
    """The members of a tar under folder `prefix` (all of them by default) into dest, relative to prefix, with
    tarfile's `data` filter (nothing outside dest, no devices, no owners of the container's)."""
    with tarfile.open(tar_path) as tar:
        for member in tar:
            rel = None if member.name == "." else _under(member.name.removeprefix("./").lstrip("/"), prefix)
            if rel is None:
                continue
            try:
                extract_member(tar, member, dest, rel)
            except (tarfile.TarError, KeyError, OSError):
                continue  # a link out of the folder or to a member left out: the patch goes on without it
