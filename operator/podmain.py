"""`python -m tracefleet.operator.podmain seal|evaluate`: the command the evaluator and sealer Job builders
still name. The programs live with the other pod programs in tracefleet.runner.pod (names.POD_PROGRAMS);
this only runs that module, so the operator package imports nothing of the runner.
"""

from __future__ import annotations

import runpy

from .names import POD_PROGRAMS

if __name__ == "__main__":
    runpy.run_module(POD_PROGRAMS, run_name="__main__", alter_sys=True)
