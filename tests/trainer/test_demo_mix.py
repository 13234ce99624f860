"""The demonstrations each GRPO step mixes in (tracefleet.trainer.demo_mix): every kind's, in turn, every step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tracefleet.trainer.demo_mix import DemoMix, row_kinds
from tracefleet.trainer.task_sampler import NO_KIND


def demo_tensors(kinds: list[str], empty: tuple[int, ...] = ()) -> dict[str, torch.Tensor]:
    rows = len(kinds)
    mask = torch.ones(rows, 6)
    for i in empty:
        mask[i] = 0
    return {"input_ids": torch.arange(rows * 6).reshape(rows, 6),
            "attention_mask": torch.ones(rows, 6, dtype=torch.long), "loss_mask": mask}


def test_every_step_holds_one_demonstration_of_every_kind_each_in_turn() -> None:
    kinds = ["create", "append", "fix", "create", "fix", "rename", "create", "append"]
    mix = DemoMix(demo_tensors(kinds, empty=(3,)), kinds)  # row 3 has no completion: never drawn
    seen: dict[str, set[int]] = {}
    for step in range(12):
        picked = mix.indices(step)
        assert sorted(kinds[i] for i in picked) == ["append", "create", "fix", "rename"], step
        for i in picked:
            seen.setdefault(kinds[i], set()).add(i)
        rows = mix.rows(step)
        assert torch.equal(rows["input_ids"], demo_tensors(kinds)["input_ids"][picked])
    assert seen == {"create": {0, 6}, "append": {1, 7}, "fix": {2, 4}, "rename": {5}}
    with pytest.raises(ValueError, match="one kind per demonstration row"):
        DemoMix(demo_tensors(kinds), kinds[:-1])


def test_a_rows_kind_is_its_tasks_and_a_task_without_one_is_the_one_kind() -> None:
    tasks = [SimpleNamespace(id="train-000", metadata={"kind": "create"}), SimpleNamespace(id="train-003",
             metadata={"kind": "fix"}), SimpleNamespace(id="other", metadata=None)]
    assert row_kinds(["train-003", "train-000-r2", "other", "unknown"], tasks) == ["fix", "create", NO_KIND, NO_KIND]
