"""Run one harness (or evaluator) process on this machine, isolated the way one machine allows.

Every process gets its own process group (so a timeout kills the harness *and* everything it
spawned), its own working directory, its own HOME and TMPDIR, and a minimal environment (the
caller's credentials never leak into a harness). Where unprivileged user namespaces work, the
process can also run in a fresh network namespace with only loopback: the proxy is then made
reachable inside through a Unix-socket bridge (`tracefleet.runner.netns`), nothing else is.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from tracefleet.process_group import die_with_parent

# Variables a harness legitimately needs from the parent; everything else is dropped.
PASSTHROUGH_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "SSL_CERT_FILE", "SSL_CERT_DIR")
KILL_GRACE_S = 2.0
POLL_S = 0.1


@dataclass
class ProcessResult:
    exit_code: int | None  # None when it never started
    timed_out: bool
    duration_s: float
    stopped: bool = False  # killed because the run was interrupted (Ctrl-C), not by its own timeout
    signal: int | None = None  # the signal that ended it, if any
    start_error: str | None = None
    stdout_path: Path | None = None
    stderr_path: Path | None = None


@dataclass
class SandboxOptions:
    netns: bool = False  # run inside a fresh network namespace with only loopback
    bridge_port: int | None = None  # loopback port inside the namespace that reaches the proxy
    bridge_socket: Path | None = None  # Unix socket outside that forwards to the proxy
    workdir: str | None = None  # with netns: the path the harness sees its working directory at (runner.netns)
    extra_env: dict[str, str] = field(default_factory=dict)


def session_path() -> str:
    """The PATH a session's programs are found on: this machine's, with the runner's interpreter first (`python`
    in a harness or test command means the runner's interpreter: its venv has pytest)."""
    path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    interpreter_dir = os.path.dirname(sys.executable)
    if interpreter_dir not in path.split(os.pathsep):
        path = interpreter_dir + os.pathsep + path
    return path


def base_env(home: Path, tmpdir: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
    env["PATH"] = session_path()
    env.setdefault("LANG", "C.UTF-8")
    env.update(
        HOME=str(home),
        TMPDIR=str(tmpdir),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        # A harness run is never interactive and must not phone home.
        CI="1",
        NO_UPDATE_NOTIFIER="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
        GIT_TERMINAL_PROMPT="0",
    )
    return env


@lru_cache(maxsize=1)
def netns_available() -> bool:
    """True when `unshare -rn` can create a user + network namespace and bring loopback up."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if not unshare or not ip:
        return False
    try:
        done = subprocess.run(
            [unshare, "-rn", ip, "link", "set", "lo", "up"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@lru_cache(maxsize=1)
def workdir_view_available() -> bool:
    """True when a harness can start in its job's workdir here: `unshare -rm` allows the mounts of
    tracefleet.runner.netns.workdir_view (tried once, in a folder of its own that is then removed)."""
    unshare = shutil.which("unshare")
    if not unshare:
        return False
    probe = tempfile.mkdtemp(prefix="tracefleet-view-")
    try:
        (Path(probe) / "workdir").mkdir()
        done = subprocess.run(
            [unshare, "-rm", sys.executable, "-c", "import os, sys; from tracefleet.runner.netns import workdir_view; "
             "workdir_view(os.getcwd(), '/workspace'); sys.exit(0 if os.getcwd() == '/workspace' else 1)"],
            cwd=Path(probe) / "workdir", capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return done.returncode == 0


def netns_argv(argv: list[str], *, bridge_port: int, bridge_socket: Path, workdir: str | None = None) -> list[str]:
    """Wrap argv so it runs in a new net namespace where 127.0.0.1:bridge_port reaches the proxy (and, with
    `workdir`, a mount namespace where the working directory is seen at `workdir`)."""
    return [
        shutil.which("unshare") or "unshare",
        "-rn" if workdir is None else "-rmn",
        sys.executable,
        "-m",
        "tracefleet.runner.netns",
        "--port",
        str(bridge_port),
        "--socket",
        str(bridge_socket),
        *(() if workdir is None else ("--workdir", workdir)),
        "--",
        *argv,
    ]


def kill_process_group(pgid: int, grace_s: float = KILL_GRACE_S) -> int | None:
    """SIGTERM the whole group, then SIGKILL what is left after grace_s. Returns the signal that
    was needed last (None when the group was already gone)."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return signal.SIGTERM
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return signal.SIGTERM
    return signal.SIGKILL


def run_sandboxed(
    argv: list[str],
    *,
    cwd: Path,
    home: Path,
    env: dict[str, str] | None = None,
    timeout_s: float,
    stdout_path: Path,
    stderr_path: Path,
    stdin_text: str | None = None,
    options: SandboxOptions | None = None,
    stop: threading.Event | None = None,
) -> ProcessResult:
    """Run argv to completion or until timeout_s / stop; the whole process group is killed at the
    end either way (a harness must not leave daemons behind)."""
    options = options or SandboxOptions()
    home.mkdir(parents=True, exist_ok=True)
    tmpdir = home / ".tmp"
    tmpdir.mkdir(parents=True, exist_ok=True)
    full_env = base_env(home, tmpdir)
    full_env.update(options.extra_env)
    full_env.update(env or {})
    if options.netns:
        if options.bridge_port is None or options.bridge_socket is None:
            raise ValueError("netns sandbox needs bridge_port and bridge_socket")
        argv = netns_argv(argv, bridge_port=options.bridge_port, bridge_socket=options.bridge_socket,
                          workdir=options.workdir)
    stdout_path.parent.mkdir(parents=True, exist_ok=True)
    stderr_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=full_env,
                stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # own session => own process group, killable as one
                close_fds=True,
                preexec_fn=die_with_parent(),  # and gone with the driver, however the driver ends
            )
        except OSError as exc:
            return ProcessResult(
                exit_code=None,
                timed_out=False,
                duration_s=time.monotonic() - started,
                start_error=f"{type(exc).__name__}: {exc}",
                stdout_path=stdout_path,
                stderr_path=stderr_path,
            )
        if stdin_text is not None and proc.stdin is not None:
            try:
                proc.stdin.write(stdin_text.encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
        deadline = started + timeout_s
        timed_out = stopped = False
        while True:
            try:
                proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            if stop is not None and stop.is_set():
                stopped = True
                break
            if time.monotonic() >= deadline:
                timed_out = True
                break
        # The group outlives its leader if the harness forked helpers; always clean it up.
        sig = kill_process_group(proc.pid)
        code = proc.wait()
    return ProcessResult(
        exit_code=code,
        timed_out=timed_out,
        stopped=stopped,
        signal=sig if (timed_out or stopped) else (-code if code < 0 else None),
        duration_s=time.monotonic() - started,
        stdout_path=stdout_path,
        stderr_path=stderr_path,
    )
