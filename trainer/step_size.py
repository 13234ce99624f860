"""GRPO's adaptive step (`tracefleet train --target-kl K`): the rule that holds each step's KL divergence from the
policy before it near K. Torch-free, so the command's help and the loop read the same constants.

- Within a step (grpo.grpo_step): a pass whose KL from the step's old policy exceeds KL_STOP * K makes no further
  update on that batch (Stable-Baselines3's PPO `target_kl`).
- Between steps (the loop): the next step's learning rate is LR_FACTOR lower after a step above twice K and
  LR_FACTOR higher after one below half of it (rl_games' `adaptive` schedule), never beyond LR_RANGE of --lr.

Why a band and not one rate: on the four-epoch warm start GRPO's 1e-4 hardly moved the policy and 5e-4 broke its
tool-call format within four steps (docs/training/real-harness.md, "GRPO's step size on the four-epoch warm start").
"""

from __future__ import annotations

KL_STOP = 1.5
LR_FACTOR = 1.5
LR_RANGE = 10.0


def adapted_lr(lr: float, kl: float, target: float, start: float) -> float:
    """The next step's learning rate after a step of KL `kl` at `lr`: LR_FACTOR lower above twice `target`, LR_FACTOR
    higher below half of it, else the same; never beyond LR_RANGE of `start` (the loop's --lr)."""
    if kl > 2 * target:
        lr /= LR_FACTOR
    elif kl < target / 2:
        lr *= LR_FACTOR
    return min(max(lr, start / LR_RANGE), start * LR_RANGE)
