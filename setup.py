"""Package layout: the component folders at the top of the repository install under the
`tracefleet` namespace. `operator/` must never be importable as a top-level `operator` (stdlib), so
each folder is mapped explicitly instead of putting the repository root on the path, and `operator/`
has no `__init__.py`: `python -m …` run from the repository root puts the root first on sys.path, and a
namespace-package folder never wins over the stdlib's regular `operator` module there."""

from setuptools import find_namespace_packages, setup

ROOTS = {
    "tracefleet": "src/tracefleet",
    "tracefleet.operator": "operator",
    "tracefleet.proxy": "proxy",
    "tracefleet.runner": "runner",
    "tracefleet.traces": "traces",
    "tracefleet.engine": "engine",
    "tracefleet.diagnostics": "diagnostics",
    "tracefleet.trainer": "trainer",
    "tracefleet.dashboard": "dashboard",
    "tracefleet.images": "images",
    "tracefleet.cli": "cli",
}

packages = list(ROOTS)
for name, folder in ROOTS.items():
    packages += [f"{name}.{sub}" for sub in find_namespace_packages(folder, exclude=["*__pycache__*"])]

setup(packages=packages, package_dir=ROOTS)
