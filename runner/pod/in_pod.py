"""`tracefleet run --in-pod`: the harness pod's program. The session runs in its pod's place: PodPlace
(tracefleet.runner.pod.harness_pod), or TaskImagePlace when the harness runs in a Harbor task's own image
(tracefleet.runner.pod.task_image). Exit status: 0 completed, 1 error, 124 timeout, 2 bad configuration."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Mapping

from tracefleet.contract.podenv import PodEnvError
from tracefleet.contract.session import SessionResult
from tracefleet.runner.pod.harness_pod import PodPlace
from tracefleet.runner.pod.task_image import TaskImagePlace
from tracefleet.runner.session import run

EXIT_CODES = {"completed": 0, "error": 1, "timeout": 124, "stopped": 143}
EXIT_CONFIG = 2


def run_in_pod(env: Mapping[str, str], *, stop: threading.Event | None = None) -> SessionResult:
    place = PodPlace(env, stop)
    if place.pod.launch_dir is not None:  # a task's own image: the harness runs in the task container
        place = TaskImagePlace(env, stop)
    return run(place.plan, place).result


def main(env: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    stop = threading.Event()
    # Pod deletion / activeDeadlineSeconds: kill the harness group, still write the artifacts.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        result = run_in_pod(env, stop=stop)
    except (PodEnvError, ValueError, OSError) as exc:
        print(f"tracefleet run --in-pod: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    summary = {"session": result.session_id, "task": result.task_id, "status": result.status, "stage": result.stage,
               "error": result.error, "harness_exit_code": result.harness_exit_code, "patch_bytes": result.patch_bytes}
    print(json.dumps(summary), flush=True)
    return EXIT_CODES.get(result.status, 1)
