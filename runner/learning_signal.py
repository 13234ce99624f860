"""How much a run's batches can teach a trainer: the reward spread and the share of GRPO groups whose
advantages are not all 0 (a group whose samples all scored the same gives the gradient nothing).

Computed with the trainers' own advantage function (`tracefleet.traces.advantages.group_advantages`),
from each session's final reward (a failed session's is 0: fail closed), without the sessions the infrastructure
failed (tracefleet.contract.semantics: left out of training), so the summary line says what
`BatchReader(...).advantages()` will find.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tracefleet.contract.semantics import OutcomeKind
from tracefleet.traces.advantages import group_advantages

if TYPE_CHECKING:
    from tracefleet.contract.session import SessionResult


def learning_signal_line(results: list[SessionResult]) -> str:
    """`rewards 0..1 (std 0.47); 2 of 3 groups (67%) have non-zero advantages`, or `-`."""
    ran = [r for r in results if r.status != "stopped" and r.outcome_kind != OutcomeKind.INFRASTRUCTURE]
    if not ran:
        return "-"
    rewards = np.array([r.reward for r in ran], dtype=np.float64)
    advantages = group_advantages(rewards, [r.group_id for r in ran], [r.session_id for r in ran])
    groups: dict[str, bool] = {}
    for result, advantage in zip(ran, advantages, strict=True):
        groups[result.group_id] = groups.get(result.group_id, False) or bool(advantage != 0)
    spread = sum(groups.values())
    return (f"rewards {rewards.min():g}..{rewards.max():g} (std {rewards.std():.2f}); {spread} of {len(groups)} groups "
            f"({100 * spread / len(groups):.0f}%) have non-zero advantages")
