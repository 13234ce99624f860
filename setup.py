"""Package layout (design §1): the component folders at the top of the repository install under the
`tracefleet` namespace. `operator/` must never be importable as a top-level `operator` (stdlib), so
each folder is mapped explicitly instead of putting the repository root on the path."""

from setuptools import find_packages, setup

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

setup(packages=packages, package_dir=ROOTS)
