"""`tracefleet train`'s per-step figures in the trackers (tracefleet.dashboard.trackers): every step's figures under
the names the dashboard draws (loop/<loop.jsonl key>), one point per step, read back as each tool reads them:
TensorBoard's event files, and an MLflow run (MLFLOW_TRACKING_URI set) through MLflow's own client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fixtures.event_files import scalars
from tracefleet.dashboard.figures import LOOP_FIGURES
from tracefleet.dashboard.trackers import MLFLOW_EXPERIMENT_NAME, MLFLOW_TRACKING_URI, TENSORBOARD_DIR, StepLogger

# hack/setup.d/26-tracking.sh: MLflow and what it needs beyond .venv (it cannot go into .venv: a pin clashes)
MLFLOW_SITE = Path(os.environ.get("TRACEFLEET_CACHE") or Path.home() / ".cache" / "tracefleet") / "tracking" / "site"
STEPS: list[dict[str, Any]] = [
    {"step": i + 1, "version": i + 1, "reward_mean": 0.25 * i, "groups": 4, "groups_with_signal": i, "loss": 0.5,
     "clipped_share": 0.0, "mean_abs_dlogprob": 0.01, "sync_s": 2.0 + i, "paused_s": 1.0, "stale_tokens_masked": 3 * i,
     "sync_steps": {"pause": 0.1}} for i in range(3)]
NAMES = {f"loop/{key}" for key, _ in LOOP_FIGURES}


def test_each_step_is_logged_under_the_dashboards_names(tmp_path: Path) -> None:
    board = StepLogger(tmp_path)
    for s in STEPS:
        board.log(s)
    board.close()
    found = scalars(tmp_path / TENSORBOARD_DIR)
    assert set(found) == NAMES
    assert found["loop/reward_mean"] == [(1, 0.0), (2, 0.25), (3, 0.5)]
    assert found["loop/signal_share"] == [(1, 0.0), (2, 0.25), (3, 0.5)]
    assert [v for _, v in found["loop/sync_s"]] == [2.0, 3.0, 4.0]


LOG = """
import json, sys
from pathlib import Path
from tracefleet.dashboard.trackers import StepLogger
board = StepLogger(Path(sys.argv[1]))
for step in json.loads(sys.argv[2]):
    board.log(step)
board.close()
"""
READ = """
import json, sys
from mlflow import MlflowClient
c = MlflowClient()
(run,) = c.search_runs([c.get_experiment_by_name(sys.argv[1]).experiment_id])
print(json.dumps({"name": run.info.run_name, "status": run.info.status, "metrics": {
    k: [[m.step, m.value] for m in sorted(c.get_metric_history(run.info.run_id, k), key=lambda m: m.step)]
    for k in run.data.metrics}}))
"""


def test_with_mlflow_configured_each_step_is_an_mlflow_step(tmp_path: Path) -> None:
    if not (MLFLOW_SITE / ".installed").is_file():
        pytest.fail(f"MLflow is missing from {MLFLOW_SITE}: run `bash hack/setup.d/26-tracking.sh`", pytrace=False)
    run_dir = tmp_path / "run-7"
    # what a user sets (a folder store needs MLflow 3's opt-in; a server's http:// URL needs none)
    env = {**os.environ, "PYTHONPATH": str(MLFLOW_SITE), MLFLOW_TRACKING_URI: (tmp_path / "mlruns").as_uri(),
           MLFLOW_EXPERIMENT_NAME: "grpo-sweep", "MLFLOW_ALLOW_FILE_STORE": "true"}
    logged = subprocess.run([sys.executable, "-c", LOG, str(run_dir), json.dumps(STEPS)], env=env, capture_output=True,
                            text=True, timeout=120)
    assert logged.returncode == 0 and "MLflow" not in logged.stderr, logged.stderr
    read = subprocess.run([sys.executable, "-c", READ, "grpo-sweep"], env=env, capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr
    run = json.loads(read.stdout)
    assert (run["name"], run["status"]) == ("run-7", "FINISHED")
    assert set(run["metrics"]) == NAMES
    assert run["metrics"]["loop/reward_mean"] == [[1, 0.0], [2, 0.25], [3, 0.5]]
    assert run["metrics"]["loop/signal_share"] == [[1, 0.0], [2, 0.25], [3, 0.5]]
    assert [v for _, v in run["metrics"]["loop/sync_s"]] == [2.0, 3.0, 4.0]
