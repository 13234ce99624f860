"""Harbor task images and the verifier, through real podman: 20 tasks x 2 samples (the issue's bench size).

    .venv/bin/python bench/harbor_tasks.py [--tasks 20] [--samples 2]

Each task: a Dockerfile FROM localhost/debian:bookworm with COPY and RUN, a bash test.sh writing reward.txt.
Prints: the image build of every task cold (an empty store for these names), again warm (cache hits: found by
content, not rebuilt), and per session the cost of what the verifier adds to a session run in a container:
a run of the agent's command in the task's image (a stand-in for the session), its change set (`podman diff` and
`podman mount`: the container's layer diff) and the verification in a fresh container of the image with it applied. The container-path vs host-path session
overhead ratio needs the session program's container place (next step) and is not measured here. Not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fixtures.harbor_tasks import write_task  # noqa: E402
from tracefleet.harbor.folders import load_task  # noqa: E402
from tracefleet.runner.containers.images import build_task_image  # noqa: E402
from tracefleet.runner.containers.runtime import BASE_IMAGE, require_runtime  # noqa: E402
from tracefleet.runner.containers.changes import change_set  # noqa: E402
from tracefleet.runner.containers.verifier import verify  # noqa: E402

TEST_SH = '#!/bin/bash\nif grep -q solved /app/state; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n'


def stats(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} s, max {max(values):.2f} s, total {sum(values):.1f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--samples", type=int, default=2)
    args = parser.parse_args()
    runtime = require_runtime()
    run_id = uuid.uuid4().hex[:8]  # new environment contents: a cold build for every task
    with tempfile.TemporaryDirectory(prefix="tracefleet-bench-harbor-") as tmp:
        tasks = [load_task(write_task(Path(tmp), f"bench-{i:02d}", test_sh=TEST_SH, test_files={}, env_files={"state": "todo\n"},
                                      dockerfile=f"FROM {BASE_IMAGE}\nWORKDIR /app\nCOPY state /app/state\n"
                                                 f"RUN echo {run_id}-{i} > /app/build-id\n"))
                 for i in range(args.tasks)]
        cold = [build_task_image(runtime, task) for task in tasks]
        warm = [build_task_image(runtime, task) for task in tasks]
        assert all(r.status == "built" for r in cold) and all(r.status == "cached" for r in warm)
        print(f"image build, cold ({len(tasks)} tasks): {stats([r.seconds for r in cold])}")
        print(f"image build, warm (cache hit):  {stats([r.seconds for r in warm])}")
        session_s, snapshot_s, verify_s, rewards = [], [], [], []
        for task, built in zip(tasks, cold):
            for sample in range(args.samples):
                name = f"tracefleet-bench-{run_id}-{task.name}-{sample}"
                script = "echo solved > /app/state" if sample % 2 == 0 else "true"
                start = time.monotonic()
                runtime.run("run", "--name", name, "--entrypoint", "bash", built.image, "-c", script, timeout=120)
                session_s.append(time.monotonic() - start)
                start = time.monotonic()
                change_set(runtime, name, Path(tmp) / "changes" / name)
                snapshot_s.append(time.monotonic() - start)
                runtime.remove(name)
                verdict = verify(runtime, task, built.image, changes=Path(tmp) / "changes" / name)
                verify_s.append(verdict.duration_s)
                rewards.append(verdict.reward)
        print(f"session stand-in (podman run): {stats(session_s)}")
        print(f"change set (diff + mount):     {stats(snapshot_s)}")
        print(f"verify (fresh container):      {stats(verify_s)}")
        print(f"rewards: {sum(rewards):g} of {len(rewards)} sessions solved (every other sample solves)")
        runtime.run("rmi", "-f", *(r.image for r in cold), check=False, timeout=600)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
