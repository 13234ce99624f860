"""`tracefleet train`'s per-step figures as TensorBoard event files (RUN/tensorboard/), under the names the
dashboard and loop.jsonl use (`loop/reward_mean`, `loop/loss`, ...: tracefleet.dashboard.figures.LOOP_FIGURES),
so `tensorboard --logdir RUN` shows the curves the dashboard draws.

tensorboardX writes them (a small writer that needs no TensorFlow); where it is not installed the logger does
nothing and says so once.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

from tracefleet.dashboard.figures import loop_series

TENSORBOARD_DIR = "tensorboard"
PREFIX = "loop/"


class StepLogger:
    def __init__(self, run_dir: Path, err: TextIO = sys.stderr) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            print("(no TensorBoard event files: pip install tensorboardX to have them)", file=err)
            self.writer = None
            return
        self.writer = SummaryWriter(logdir=str(Path(run_dir) / TENSORBOARD_DIR), flush_secs=5)

    def log(self, step: dict[str, Any]) -> None:
        if self.writer is None:
            return
        at = int(step.get("step", 0))
        for key, values in loop_series([step]).items():
            if isinstance(values[0], int | float) and not isinstance(values[0], bool):
                self.writer.add_scalar(PREFIX + key, float(values[0]), at)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

