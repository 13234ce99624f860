"""A training loop's per-step figures where people already look: TensorBoard event files (RUN/tensorboard/) and,
when configured, an MLflow run, under the names the dashboard and loop.jsonl use (`loop/reward_mean`,
`loop/loss`, ...: tracefleet.dashboard.figures.LOOP_FIGURES), one point per step.

`StepLogger` turns a step (a loop.jsonl record) into those figures once and hands them to each tracker:
- TensorBoard, by tensorboardX (a small writer that needs no TensorFlow), always; not installed: said once;
- MLflow, when MLFLOW_TRACKING_URI is set (MLflow's own variable; MLFLOW_EXPERIMENT_NAME picks the experiment,
  else its default one), by MLflow's client (`pip install 'tracefleet[tracking]'`); not installed: said once.
A tracker that fails is left out, said once: it never stops the training.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Protocol, TextIO

from tracefleet.dashboard.figures import loop_series

TENSORBOARD_DIR = "tensorboard"
PREFIX = "loop/"
# MLflow's own variables: what an MLflow user has set already
MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"
MLFLOW_EXPERIMENT_NAME = "MLFLOW_EXPERIMENT_NAME"
MLFLOW_DEFAULT_EXPERIMENT = "Default"


def step_figures(step: dict[str, Any]) -> dict[str, float]:
    """The step's figures that it has, by the names every tracker writes them under."""
    return {PREFIX + key: float(values[0]) for key, values in loop_series([step]).items() if values[0] is not None}


class Tracker(Protocol):
    def log(self, figures: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoard:
    def __init__(self, run_dir: Path) -> None:
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(logdir=str(Path(run_dir) / TENSORBOARD_DIR), flush_secs=5)

    def log(self, figures: dict[str, float], step: int) -> None:
        for name, value in figures.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MLflow:
    """The MLflow run already active in this process (a trainer's own MLflow logging started it: TRL's `report_to`),
    else one of its own, named for the run folder, in MLFLOW_EXPERIMENT_NAME (else MLflow's default experiment)."""

    def __init__(self, run_dir: Path) -> None:
        import mlflow

        self.mlflow, self.run_dir = mlflow, Path(run_dir).resolve()
        self.client = mlflow.MlflowClient()  # MLFLOW_TRACKING_URI
        self.run_id, self.own = "", False

    def _run(self) -> str:
        # at the first step, not before: a trainer's callback starts its run when training begins
        if not self.run_id:
            active = self.mlflow.active_run()
            if active is not None:
                self.run_id = active.info.run_id
            else:
                name = os.environ.get(MLFLOW_EXPERIMENT_NAME) or MLFLOW_DEFAULT_EXPERIMENT
                experiment = self.client.get_experiment_by_name(name)
                experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
                self.run_id = self.client.create_run(experiment_id, run_name=self.run_dir.name,
                                                     tags={"tracefleet.run_dir": str(self.run_dir)}).info.run_id
                self.own = True
        return self.run_id

    def log(self, figures: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self._run(), metrics=[Metric(name, value, now, step) for name, value in figures.items()])

    def close(self) -> None:
        if self.own:
            self.client.set_terminated(self.run_id)


class StepLogger:
    """Every configured tracker, fed each step's figures (`step`: its loop.jsonl record, `step` its number)."""

    def __init__(self, run_dir: Path, err: TextIO = sys.stderr) -> None:
        self.trackers: list[Tracker] = []
        self.err = err
        try:
            self.trackers.append(TensorBoard(run_dir))
        except ImportError:
            print("(no TensorBoard event files: pip install tensorboardX to have them)", file=err)
        if os.environ.get(MLFLOW_TRACKING_URI):
            try:
                self.trackers.append(MLflow(run_dir))
            except ImportError:
                print(f"({MLFLOW_TRACKING_URI} is set but MLflow is not installed: pip install 'tracefleet[tracking]' "
                      "to log to it)", file=err)
            except Exception as exc:  # noqa: BLE001 - a tracker that cannot start never stops the training
                print(f"(not logging to MLflow at {os.environ[MLFLOW_TRACKING_URI]}: {exc})", file=err)

    def log(self, step: dict[str, Any]) -> None:
        figures = step_figures(step)
        for tracker in list(self.trackers) if figures else []:
            try:
                tracker.log(figures, int(step.get("step", 0)))
            except Exception as exc:  # noqa: BLE001 - nor one that fails later: it is left out, said once
                self.trackers.remove(tracker)
                print(f"(no longer logging to {type(tracker).__name__}: {exc})", file=self.err)

    def close(self) -> None:
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as exc:  # noqa: BLE001 - closing runs in the loop's `finally`: it never masks its error
                print(f"(closing {type(tracker).__name__}: {exc})", file=self.err)
