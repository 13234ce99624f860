"""GRPO's adaptive step (tracefleet.trainer.step_size): the next learning rate after a step, from the step's KL."""

from __future__ import annotations

import pytest

from tracefleet.trainer.step_size import LR_FACTOR, LR_RANGE, adapted_lr


def test_the_rate_falls_above_the_band_rises_below_it_and_holds_in_it() -> None:
    start, target = 1e-4, 0.02
    assert adapted_lr(start, 0.05, target, start) == pytest.approx(start / LR_FACTOR)  # above twice the target
    assert adapted_lr(start, 0.005, target, start) == pytest.approx(start * LR_FACTOR)  # below half of it
    for kl in (0.011, 0.02, 0.039):
        assert adapted_lr(start, kl, target, start) == start


def test_the_rate_stays_within_its_range_of_the_loops_rate() -> None:
    start, target, lr = 1e-4, 0.02, 1e-4
    for _ in range(30):  # a policy that never moves: the rate rises to LR_RANGE times --lr and no further
        lr = adapted_lr(lr, 0.0, target, start)
    assert lr == pytest.approx(start * LR_RANGE)
    for _ in range(30):  # one that always overshoots: down to --lr / LR_RANGE
        lr = adapted_lr(lr, 1.0, target, start)
    assert lr == pytest.approx(start / LR_RANGE)
