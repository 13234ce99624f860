"""The containers of one `tracefleet run` removed however the run ends, SIGKILL included, when nothing of the run is
left to remove them.

Every container a run's sessions start (the agent's, the verifier's) carries the label `tracefleet.io/run=<id>`
(`ContainerPlace` adds it to the runtime's run flags). `Reaper` starts this module as a process of its own session
(a Ctrl-C at the terminal does not reach it) that blocks reading a pipe the run holds the other end of: when the run
ends, in whatever way, the kernel closes that end, the read returns, and the reaper removes every container still
carrying the label. A run that ended normally removed its own containers already: the reaper finds none.

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


class Reaper:
    """The reaper of the containers labelled `label`, running until `close` (or until this process ends)."""

    def __init__(self, label: str, runtime_argv: tuple[str, ...], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", __name__, label, *runtime_argv], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env={**os.environ, **env}, start_new_session=True)

    def close(self) -> None:
        """Let it look once more (and find nothing, when every container was removed) and end."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=REMOVE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def reap(label: str, runtime: list[str]) -> bool:
    """Remove the containers labelled `label`; whether there were any."""
    found = subprocess.run([*runtime, "ps", "-a", "-q", "--filter", f"label={label}"], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=REMOVE_TIMEOUT_S)
    ids = found.stdout.split()
    if ids:
        # -t 0: no grace for a PID 1 that ignores SIGTERM; podman's `rm -f` stops a running one first
        subprocess.run([*runtime, "rm", "-f", *(("-t", "0") if "podman" in runtime[0] else ()), *ids],
                       capture_output=True, stdin=subprocess.DEVNULL, timeout=REMOVE_TIMEOUT_S)
    return bool(ids)


def main(argv: list[str]) -> int:
    label, runtime = argv[0], argv[1:]
    sys.stdin.buffer.read()  # until the run closes its end: it finished, or it died
    while reap(label, runtime):
        # the run died: a `podman run` it had under way may still be creating its container; look until none is left
        time.sleep(AGAIN_AFTER_S)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
