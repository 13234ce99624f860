"""The containers of one `tracefleet run` removed however the run ends, SIGKILL included, when nothing of the run is
left to remove them.

Every container a run's sessions start (the agent's, the verifier's) carries the label `tracefleet.io/run=<id>`
(`ContainerPlace` adds it to the runtime's run flags). `Reaper` starts this module as a process of its own session
(a Ctrl-C at the terminal does not reach it) that blocks reading a pipe the run holds the other end of: when the run
ends, in whatever way, the kernel closes that end, the read returns, and the reaper removes every container still
carrying the label. A run that ended normally removed its own containers already: the reaper finds none. A container
that cannot be removed (the runtime refuses, a storage fault) is not looked for for ever: after `GIVE_UP_AFTER_S` the
reaper writes one line naming what is left and how to remove it to the run's stderr, and exits 1.

    python -m tracefleet.runner.containers.reaper LABEL RUNTIME-ARGV...
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

RUN_LABEL = "tracefleet.io/run"
REMOVE_TIMEOUT_S = 120
AGAIN_AFTER_S = 2.0
# A `podman run` the dead run had under way creates its container within seconds; past this, what is left stays.
GIVE_UP_AFTER_S = 60.0


class Reaper:
    """The reaper of the containers labelled `label`, running until `close` (or until this process ends)."""

    def __init__(self, label: str, runtime_argv: tuple[str, ...], env: dict[str, str]) -> None:
        # stderr is the run's: the one line saying what could not be removed reaches its terminal or log
        self.proc = subprocess.Popen([sys.executable, "-m", __name__, label, *runtime_argv], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, env={**os.environ, **env}, start_new_session=True)

    def close(self) -> None:
        """Let it look once more (and find nothing, when every container was removed) and end."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=GIVE_UP_AFTER_S + 2 * REMOVE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def labelled(label: str, runtime: list[str]) -> list[str]:
    """The ids of the containers labelled `label`, running or not."""
    found = subprocess.run([*runtime, "ps", "-a", "-q", "--filter", f"label={label}"], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=REMOVE_TIMEOUT_S)
    return found.stdout.split()


def remove(runtime: list[str], ids: list[str]) -> None:
    # -t 0: no grace for a PID 1 that ignores SIGTERM; podman's `rm -f` stops a running one first
    subprocess.run([*runtime, "rm", "-f", *(("-t", "0") if "podman" in runtime[0] else ()), *ids],
                   capture_output=True, stdin=subprocess.DEVNULL, timeout=REMOVE_TIMEOUT_S)


def reap(label: str, runtime: list[str], give_up_after_s: float = GIVE_UP_AFTER_S) -> list[str]:
    """Remove the containers labelled `label` until none is left, looking again every AGAIN_AFTER_S (the run died: a
    `podman run` it had under way may still be creating its container); the ids still there after `give_up_after_s`
    (none when every one went)."""
    deadline = time.monotonic() + give_up_after_s
    while ids := labelled(label, runtime):
        if time.monotonic() >= deadline:
            return ids
        remove(runtime, ids)
        time.sleep(AGAIN_AFTER_S)
    return []


def left_line(label: str, runtime: list[str], ids: list[str], waited_s: float) -> str:
    """The report of containers the reaper could not remove: how many, which, and the command that removes them."""
    return (f"tracefleet: {len(ids)} container(s) labelled {label} could not be removed in {waited_s:.0f}s: "
            f"{' '.join(ids)}; remove them with `{' '.join(runtime)} rm -f {' '.join(ids)}`")


def main(argv: list[str]) -> int:
    label, runtime = argv[0], argv[1:]
    sys.stdin.buffer.read()  # until the run closes its end: it finished, or it died
    left = reap(label, runtime)
    if left:
        print(left_line(label, runtime, left, GIVE_UP_AFTER_S), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
