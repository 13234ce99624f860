"""`tracefleet tasks build`: each task's environment/ built with real podman into an image named by its content;
an unchanged folder is found again (not rebuilt), a changed one gets a new name, a Dockerfile that fails is one
line naming the task and the build's last error line while the other tasks are built."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures.harbor_tasks import write_task
from tracefleet.harbor.folders import load_task
from tracefleet.harbor.image_names import environment_digest, repository_name, task_image
from tracefleet.runner.containers.images import build_task_image
from tracefleet.runner.containers.runtime import BASE_IMAGE, ContainerRuntime

COPY_RUN = f"FROM {BASE_IMAGE}\nWORKDIR /app\nCOPY greet.py /app/greet.py\nRUN echo built-{{n}} > /app/stamp\n"
FAILING = f"FROM {BASE_IMAGE}\nRUN echo about to fail >&2 && exit 3\n"


def _tasks_build(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracefleet", "tasks", "build", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def cleanup_images(container_runtime: ContainerRuntime):
    images: list[str] = []
    yield images
    if images:
        container_runtime.run("rmi", "-f", *images, check=False, timeout=120)


def test_build_names_by_content_caches_and_reports_a_failure_in_one_line(
        tmp_path: Path, container_runtime: ContainerRuntime, cleanup_images: list[str]) -> None:
    src = tmp_path / "tasks"
    first = write_task(src, "Copy_Run-1", dockerfile=COPY_RUN.format(n=1))
    write_task(src, "copy-run-2", dockerfile=COPY_RUN.format(n=2))
    write_task(src, "broken", dockerfile=FAILING)
    images = {name: task_image(load_task(src / name)) for name in ("Copy_Run-1", "copy-run-2", "broken")}
    cleanup_images += images.values()
    assert images["Copy_Run-1"] == (f"localhost/tracefleet-task/copy_run-1:"
                                    f"{environment_digest(first / 'environment')[:16]}")

    start = time.monotonic()
    proc = _tasks_build("tasks", "--logs", "logs", cwd=tmp_path)
    cold = time.monotonic() - start
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1, proc.stderr
    assert lines[0].startswith(f"Copy_Run-1: built {images['Copy_Run-1']} ("), lines
    assert lines[1] == ('broken: image build failed: Error: building at STEP "RUN echo about to fail >&2 && exit 3": '
                        'while running runtime: exit status 3'), lines
    assert lines[2].startswith(f"copy-run-2: built {images['copy-run-2']} (")  # the next task went on
    assert "about to fail" in (tmp_path / "logs" / "broken.build.log").read_text()
    for name, n in (("Copy_Run-1", 1), ("copy-run-2", 2)):
        out = container_runtime.run("run", "--rm", images[name], "cat", "/app/stamp", "/app/greet.py", timeout=120)
        assert out.stdout == f"built-{n}\nprint(\"hello, world\")\n"

    start = time.monotonic()
    proc = _tasks_build("tasks", "--include", "*-1", cwd=tmp_path)
    warm = time.monotonic() - start
    assert proc.returncode == 0 and proc.stdout.startswith(f"Copy_Run-1: cached {images['Copy_Run-1']} ("), proc.stdout
    print(f"\ntasks build: 2 tasks + 1 failing cold {cold:.1f} s; 1 task cache hit {warm:.2f} s (whole command)")

    # A changed file in environment/ is a new image; the old one is left alone.
    (first / "environment" / "greet.py").write_text('print("changed")\n')
    changed = load_task(first)
    assert task_image(changed) != images["Copy_Run-1"]
    cleanup_images.append(task_image(changed))
    result = build_task_image(container_runtime, changed)
    assert result.status == "built" and result.image == task_image(changed)
    again = build_task_image(container_runtime, changed)
    assert again.status == "cached"
    print(f"one COPY+RUN build {result.seconds:.2f} s, cache hit {again.seconds:.3f} s (in process)")


def test_a_named_image_is_not_built(tmp_path: Path, container_runtime: ContainerRuntime) -> None:
    task = load_task(write_task(tmp_path, "prebuilt", dockerfile=None,
                                toml='[environment]\ndocker_image = "ghcr.io/example/tb2:1"\n'))
    result = build_task_image(container_runtime, task)
    assert (result.status, result.image) == ("prebuilt", "ghcr.io/example/tb2:1")


def test_repository_names() -> None:
    assert repository_name("Fix the Bug #12") == "fix-the-bug-12"
    assert repository_name("__") == "task"
