"""Stopping a child started in its own session together with everything it forked (vLLM's API server and its
engine-core process), without signalling a process that has already exited.

Why not `os.killpg(pgid, SIGKILL)` after a timeout: a group whose leader has exited but not been reaped still
"exists" to killpg, so a late SIGKILL lands on nothing alive and hides the real exit; and a `proc.wait(timeout)`
from a signal handler cannot reap a child the main thread is already waiting on (CPython's waitpid lock), so it
runs out its timeout on a process that exited long ago. Members are read from /proc (Linux), zombies excluded.

A child must not outlive the driver that started it, however the driver ends (SIGKILL included, when nothing of
it runs to stop the child): `die_with_parent` is the child's `preexec_fn` (Linux's PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

POLL_S = 0.05
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn` for Popen: the child gets `sig` when the thread that started it ends (its process killed
    included), and exits at once if that already happened. Start such children from a thread that lives as long
    as they should (the main thread, a session's worker). Nothing on a system without prctl."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: after fork only async-signal-safe calls
    except (OSError, AttributeError):
        return lambda: None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl took effect
            os._exit(1)

    return preexec


def running_members(pgid: int) -> list[int]:
    """Pids of the processes in process group `pgid` that still run (a zombie has exited: it only waits to be
    reaped by its parent)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # exited while we looked
            continue
        # after the command name (which may hold spaces and parentheses): state, ppid, pgrp, ...
        fields = text.rpartition(")")[2].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            pids.append(int(stat.parent.name))
    return pids


def stop_group(proc: subprocess.Popen, grace_s: float) -> tuple[float, list[int]]:
    """SIGTERM to `proc`'s process group (it must lead its own session), then wait up to grace_s for the leader
    to exit and every other member to be gone; SIGKILL, one pid at a time, only those still running then.
    Returns the seconds it took and the pids it had to kill. Call it from the thread that owns `proc` (not from a signal handler)."""
    started = time.monotonic()
    deadline = started + grace_s
    pgid = proc.pid
    if proc.poll() is None or running_members(pgid):
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    while running_members(pgid) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    killed = running_members(pgid)
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    return time.monotonic() - started, killed
