"""`tracefleet train`'s TensorBoard event files (tracefleet.dashboard.tensorboard): every step's figures under the
names the dashboard draws (loop/<loop.jsonl key>), read back from the event files as TensorBoard reads them."""

from __future__ import annotations

import struct
from pathlib import Path

from tensorboardX.proto.event_pb2 import Event

from tracefleet.dashboard.figures import LOOP_FIGURES
from tracefleet.dashboard.tensorboard import TENSORBOARD_DIR, StepLogger


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under `folder` (TFRecord: length, its crc, the Event, the Event's crc)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (n,) = struct.unpack("<Q", data[at : at + 8])
            event = Event.FromString(data[at + 12 : at + 12 + n])
            at += 12 + n + 4
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


def test_each_step_is_logged_under_the_dashboards_names(tmp_path: Path) -> None:
    steps = [{"step": i + 1, "version": i + 1, "reward_mean": 0.25 * i, "groups": 4, "groups_with_signal": i, "loss": 0.5,
              "clipped_share": 0.0, "mean_abs_dlogprob": 0.01, "sync_s": 2.0 + i, "paused_s": 1.0,
              "stale_tokens_masked": 3 * i, "sync_steps": {"pause": 0.1}} for i in range(3)]
    board = StepLogger(tmp_path)
    for s in steps:
        board.log(s)
    board.close()
    found = scalars(tmp_path / TENSORBOARD_DIR)
    assert set(found) == {f"loop/{key}" for key, _ in LOOP_FIGURES}
    assert found["loop/reward_mean"] == [(1, 0.0), (2, 0.25), (3, 0.5)]
    assert found["loop/signal_share"] == [(1, 0.0), (2, 0.25), (3, 0.5)]
    assert [v for _, v in found["loop/sync_s"]] == [2.0, 3.0, 4.0]
