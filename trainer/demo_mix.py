"""The warm start's demonstrations mixed into GRPO's steps (`tracefleet train --demo-mix COEF`).

Why: a GRPO batch holds the kinds its groups with spread came from. On the example's four-epoch warm start
nearly all of them were `append`'s, `create`'s and `rename`'s, and a larger step raised `bash` as the first call
of every kind: the held-out `fix` sessions, which no batch held, went from `read` to `bash` and from 11 of 15
solved to 1 (docs/training/real-harness.md, "An adaptive step"). A KL term over the batch's tokens cannot see
that. So each update also minimises COEF times the NLL of a few demonstrations, one of every kind in turn
(InstructGPT's PPO-ptx, with the demonstrations in place of pretraining text).

Honest by construction: a demonstration's tokens are trained as what they are, demonstrations (the warm start's
loss on the scripted engine's tokens, the loss mask marking its completions), in their own term beside GRPO's.
They never enter GRPO's objective, its advantages or a sealed batch, which holds only the policy's own samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tracefleet.trainer.task_sampler import base_task, task_kind


class DemoMix:
    """The demonstrations' rows by kind; `rows(k)` is step k's: the k-th (cycling) of every kind's rows."""

    def __init__(self, tensors: dict[str, Any], row_kinds: Sequence[str]) -> None:
        if len(row_kinds) != int(tensors["input_ids"].shape[0]):
            raise ValueError("one kind per demonstration row")
        self.tensors = tensors
        self.by_kind: dict[str, list[int]] = {}
        for i, kind in enumerate(row_kinds):
            if float(tensors["loss_mask"][i].sum()):
                self.by_kind.setdefault(kind, []).append(i)
        if not self.by_kind:
            raise ValueError("no demonstration has a trainable token")

    def indices(self, step: int) -> list[int]:
        return [rows[step % len(rows)] for _, rows in sorted(self.by_kind.items())]

    def rows(self, step: int) -> dict[str, Any]:
        from tracefleet.traces.reader import take_rows

        return take_rows(self.tensors, self.indices(step))


def row_kinds(task_ids: Sequence[str], tasks: Sequence[Any]) -> list[str]:
    """Each demonstration row's kind (its task's `metadata.kind`), from the job's tasks."""
    kinds = {t.id: task_kind(t.metadata) for t in tasks}
    return [kinds.get(base_task(i), task_kind(None)) for i in task_ids]
