"""Every example in examples/ runs as written (a test runs it, with what it needs) or says in its first line what
it needs (`# Needs: ...`). The Kubernetes examples (examples/k8s/) are the cluster tests' (applied with
`--dry-run=server`, and run by the operator's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
# example -> the test that runs it as written
RUN_BY = {
    "quickstart/job.yaml": "tests/runner/test_runner_quickstart.py",
    "quickstart/agent.py": "tests/runner/test_runner_quickstart.py",
    "local-command.yaml": "tests/runner/test_runner_examples.py",
    "local_agent.py": "tests/runner/test_runner_examples.py",
    "real-harness/job.yaml": "tests/runner/test_runner_real_harness.py",
    "grpo/train_step.py": "tests/traces/test_traces_grpo_example.py",
}


def examples() -> list[Path]:
    """The examples a user runs: jobs and programs, not the tasks' own files (tasks/) nor the cluster's (k8s/)."""
    return sorted(p for p in EXAMPLES.rglob("*") if p.suffix in (".yaml", ".yml", ".py") and p.is_file()
                  and not {"tasks", "k8s"} & set(p.relative_to(EXAMPLES).parts))


def first_line(path: Path) -> str:
    """The first line that is not a shebang (a program's docstring counts without its quotes)."""
    lines = [l for l in path.read_text().splitlines() if l.strip() and not l.startswith("#!")]
    return lines[0].lstrip('"') if lines else ""


@pytest.mark.parametrize("path", examples(), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_every_example_runs_or_says_what_it_needs(path: Path) -> None:
    name = str(path.relative_to(EXAMPLES))
    if name in RUN_BY:
        assert (REPO / RUN_BY[name]).exists(), (name, RUN_BY[name])
        return
    assert first_line(path).startswith("# Needs: "), f"examples/{name}: its first line must say what it needs"


def test_local_command_example_runs_as_written(cpu_engine: Any, tmp_path: Path) -> None:
    """examples/local-command.yaml with what its first line asks for: an engine (the CPU engine, by --engine-url)."""
    assert first_line(EXAMPLES / "local-command.yaml").startswith("# Needs: an OpenAI-compatible engine")
    done = subprocess.run(
        [sys.executable, "-m", "tracefleet.cli", "run", str(EXAMPLES / "local-command.yaml"), "--engine-url", cpu_engine.url,
         "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "status         completed 2" in done.stdout, done.stdout
    job = yaml.safe_load((EXAMPLES / "local-command.yaml").read_text())
    assert list((tmp_path / job["spec"]["output"]["uri"] / "local-command" / "batches").glob("*/manifest.json"))
