"""Package layout (design §1): the component folders at the top of the repository install under the
`tracefleet` namespace. `operator/` must never be importable as a top-level `operator` (stdlib), so
each folder is mapped explicitly instead of putting the repository root on the path."""

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOTS = {
    "tracefleet": "src/tracefleet",
    "tracefleet.operator": "operator",
    "tracefleet.proxy": "proxy",
    "tracefleet.runner": "runner",
    "tracefleet.traces": "traces",
    "tracefleet.engine": "engine",
}

packages = list(ROOTS)
for name, folder in ROOTS.items():
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

# `python -c`/`python -m` put the current directory first on sys.path; from a checkout, its `operator/`
# folder would then shadow the stdlib. A .pth line runs at start-up, before the current directory is on
# the path, and pins the stdlib module in sys.modules first.
STDLIB_PIN = "tracefleet-stdlib-operator.pth"


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        Path(self.build_lib, STDLIB_PIN).write_text("import operator\n")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib, STDLIB_PIN))]


setup(packages=packages, package_dir=ROOTS, cmdclass={"build_py": BuildPy})
