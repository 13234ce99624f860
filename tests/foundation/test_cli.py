"""The `tracefleet` console script: help a newcomer can act on, and the crd/validate subcommands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tracefleet.api.crd import CRD_FILENAME, crd_yaml
from tracefleet.api.reference import REFERENCE_PAGE, manifest_reference

REPO = Path(__file__).resolve().parents[2]
# The console script installed next to the interpreter running the tests (.venv/bin/tracefleet).
SCRIPT = Path(sys.executable).parent / "tracefleet"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_console_script_is_installed() -> None:
    assert SCRIPT.exists(), f"{SCRIPT} missing: install the project (pip install -e .)"


def test_version_is_the_distributions() -> None:
    from importlib.metadata import version

    proc = run("--version")
    assert proc.returncode == 0 and proc.stdout == f"tracefleet {version('tracefleet')}\n", proc


def test_top_level_help_lists_every_subcommand() -> None:
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    for name in ("run", "proxy", "engine", "operator", "traces", "crd", "validate"):
        assert f"    {name} " in proc.stdout or f"    {name}\n" in proc.stdout, (name, proc.stdout)
    # `python -m tracefleet` is the same command.
    same = subprocess.run([sys.executable, "-m", "tracefleet", "--help"], capture_output=True, text=True, timeout=120)
    assert same.returncode == 0 and same.stdout.replace("__main__.py", "tracefleet") == proc.stdout


@pytest.mark.parametrize(
    "name, needles",
    [
        ("crd", ["--out", "--stdout", "--reference-page", "kubectl apply", CRD_FILENAME]),
        ("validate", ["FILE", "field.path: message", "exit status 1", "examples/*.yaml"]),
    ],
)
def test_subcommand_help_is_actionable(name: str, needles: list[str]) -> None:
    proc = run(name, "--help")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    for needle in needles:
        assert needle in text, (needle, proc.stdout)


def test_crd_writes_the_generated_file(tmp_path: Path) -> None:
    proc = run("crd", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    written = tmp_path / "out" / CRD_FILENAME
    assert written.read_text() == crd_yaml()
    assert run("crd", "--stdout").stdout == crd_yaml()
    assert run("crd", "--reference").stdout == manifest_reference()


def test_crd_refreshes_the_reference_page(tmp_path: Path) -> None:
    # In the repository (here a stand-in), plain `tracefleet crd` refreshes the docs page too.
    page = tmp_path / REFERENCE_PAGE
    page.parent.mkdir(parents=True)
    page.write_text("# x\n\n<!-- manifest-reference:start -->\nstale\n<!-- manifest-reference:end -->\ntail\n")
    proc = run("crd", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    assert "stale" not in text and manifest_reference() in text and text.endswith("tail\n")
    assert f"updated {REFERENCE_PAGE}" in proc.stderr and (tmp_path / "crds" / CRD_FILENAME).exists()
    # A page named that has no marked section is refused, exit 2, the last line saying why.
    other = tmp_path / "other.md"
    other.write_text("# nothing marked\n")
    bad = run("crd", "--out", str(tmp_path / "crds"), "--reference-page", str(other))
    assert bad.returncode == 2 and "manifest-reference" in bad.stderr.splitlines()[-1], bad.stderr


def test_validate_exit_codes(tmp_path: Path) -> None:
    ok = run("validate", str(REPO / "examples" / "local-command.yaml"))
    assert ok.returncode == 0 and ok.stdout == ""
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: tracefleet.io/v1alpha1\nkind: RolloutJob\nmetadata: {name: x}\nspec: {parallelism: 0}\n")
    proc = run("validate", str(bad))
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    # Every problem, each with its path: the four missing sections and the bad number.
    for path in ("spec.inference", "spec.harness", "spec.tasks", "spec.output", "spec.parallelism"):
        assert any(line.startswith(f"{bad}: {path}: ") for line in lines), (path, lines)
    syntax = tmp_path / "syntax.yaml"
    syntax.write_text("spec: [unclosed\n")
    proc = run("validate", str(syntax))
    assert proc.returncode == 1 and "invalid YAML" in proc.stdout


@pytest.mark.parametrize("name", ["run", "proxy", "engine", "operator", "traces", "crd", "validate"])
def test_every_subcommand_answers_help(name: str) -> None:
    """Each subcommand imports only its own component and explains itself: `--help` works without a
    cluster, an engine or a bucket, and shows the usage line and its options."""
    proc = run(name, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: tracefleet {name}"), proc.stdout
    assert "options:" in proc.stdout and "-h, --help" in proc.stdout, proc.stdout
