"""One distribution, `tracefleet.*` only: the repository's `operator/` folder never shadows the stdlib.

Checked for the editable install the tests run from and for a real wheel installed into a fresh
virtualenv, each from the repository root (where `operator/` sits in the current directory) and from
an unrelated directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, operator, sys, sysconfig
import tracefleet, tracefleet.operator.cli, tracefleet.proxy, tracefleet.runner, tracefleet.api
from tracefleet.api import RolloutJob
print(json.dumps({
    "operator": operator.__file__,
    "stdlib": sysconfig.get_paths()["stdlib"],
    "itemgetter": operator.itemgetter(1)([0, 7]),
    "tf_operator": tracefleet.operator.cli.__file__,
    "tracefleet": tracefleet.__file__,
    "api": tracefleet.api.__file__,
    "kind": RolloutJob.model_fields["kind"].annotation.__args__[0],
}))
"""


def probe(python: str | Path, cwd: Path) -> dict[str, object]:
    # No PYTHONPATH from the test runner: only what the interpreter's own install provides.
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    proc = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
    # From a checkout, `python -c`/`-m` search the current directory first; `./operator/` has no
    # __init__.py, so it is only a namespace portion there and the stdlib module wins (setup.py).
    assert proc.returncode == 0, f"probe failed in {cwd}:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_stdlib_operator(got: dict[str, object]) -> None:
    assert Path(str(got["operator"])).parent == Path(str(got["stdlib"])), got
    assert got["itemgetter"] == 7
    assert Path(str(got["tf_operator"])).name == "cli.py"
    assert got["kind"] == "RolloutJob"


@pytest.mark.parametrize("where", ["repo-root", "elsewhere"])
def test_editable_install_keeps_stdlib_operator(where: str, tmp_path: Path) -> None:
    got = probe(sys.executable, REPO if where == "repo-root" else tmp_path)
    check_stdlib_operator(got)
    # Editable: the package is the repository's own folder, mapped under the tracefleet namespace.
    assert Path(str(got["tf_operator"])).parent == REPO / "operator"
    assert Path(str(got["tracefleet"])).parent == REPO / "src" / "tracefleet"


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A wheel built from the working tree, installed (no deps) into a fresh venv that borrows the test
    venv's third-party packages through a .pth file (no network, no editable finder)."""
    root = tmp_path_factory.mktemp("wheel")
    # Build from a copy: setuptools builds in-tree (build/, *.egg-info) and the checkout stays clean.
    src = root / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "node_modules", "__pycache__", "*.egg-info", ".cache", ".pytest_cache"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root / "dist"), str(src)],
        check=True, timeout=300, capture_output=True,
    )
    wheel = next((root / "dist").glob("tracefleet-*.whl"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # A plain path line: the borrowed directory's own .pth files (the editable finder) are not run.
    (site / "_borrowed_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True, timeout=300, capture_output=True,
    )
    return wheel, python


def test_wheel_has_no_top_level_operator(wheel_venv: tuple[Path, Path]) -> None:
    wheel, _ = wheel_venv
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if "/" in n and ".dist-info/" not in n}
    assert tops == {"tracefleet"}, tops
    assert "tracefleet/operator/cli.py" in names and "tracefleet/contract/job.py" in names
    assert "tracefleet/cli/__init__.py" in names and "tracefleet/images/build.py" in names  # the top folders too
    assert not [n for n in names if "/" not in n], "nothing may install outside the tracefleet namespace"
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "tracefleet = tracefleet.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


@pytest.mark.parametrize("where", ["repo-root", "elsewhere"])
def test_wheel_install_keeps_stdlib_operator(wheel_venv: tuple[Path, Path], where: str, tmp_path: Path) -> None:
    _, python = wheel_venv
    got = probe(python, REPO if where == "repo-root" else tmp_path)
    check_stdlib_operator(got)
    # Non-editable: the code comes from the venv's site-packages, not from the repository.
    site = python.parent.parent
    assert Path(str(got["tf_operator"])).is_relative_to(site), got
    assert Path(str(got["api"])).is_relative_to(site), got
    script = python.parent / "tracefleet"
    proc = subprocess.run([str(script), "validate", "--help"], capture_output=True, text=True, timeout=120,
                          cwd=REPO if where == "repo-root" else tmp_path)
    assert proc.returncode == 0 and "field.path" in " ".join(proc.stdout.split()), proc.stderr


def test_bare_interpreter_in_checkout_keeps_stdlib_operator(tmp_path: Path) -> None:
    """Before anything is installed (the first `python -m pip install -e .` of a new checkout), a fresh
    venv's interpreter run from the repository root must still get the stdlib `operator`: everything
    Python imports at start-up (collections, contextlib, runpy) depends on it."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "json.tool", "--help"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", "import operator; print(operator.__file__)"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and Path(proc.stdout.strip()).parent != REPO / "operator", proc
