"""A GRPO step over only the rows with a non-zero advantage (tracefleet.trainer.loop.with_signal) gives the same
update as the step over the whole batch: a zero-advantage row adds nothing to the gradient, so the loop spends no
forward pass on it."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tracefleet.trainer.grpo import grpo_step, trainable  # noqa: E402
from tracefleet.trainer.loop import with_signal  # noqa: E402

from fixtures.tiny_llama import tiny_policy  # noqa: E402


def batch() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    lengths = [12, 9, 7, 12]
    ids = torch.randint(1, 64, (4, 12), generator=g)
    attention = torch.tensor([[1] * n + [0] * (12 - n) for n in lengths])
    loss_mask = torch.tensor([[0.0] * 4 + [1.0] * (n - 4) + [0.0] * (12 - n) for n in lengths])
    seq_adv = torch.tensor([0.0, 0.8, -0.8, 0.0])  # rows 0 and 3: a group with equal rewards
    return {"input_ids": ids * attention, "attention_mask": attention, "loss_mask": loss_mask,
            "old_logprobs": -3.0 * loss_mask, "advantages": seq_adv[:, None] * loss_mask,
            "token_versions": loss_mask.long() - 1, "temperatures": torch.ones(4, 12),
            "rewards": torch.tensor([1.0, 1.0, 0.0, 1.0]), "sequence_advantages": seq_adv}


def test_the_rows_with_signal_give_the_whole_batchs_update() -> None:
    t = batch()
    signal = with_signal(t)
    assert signal is not None and signal["input_ids"].shape == (2, 9)  # rows 1 and 2, cut to the longer one
    updated = []
    for rows, tokens in ((t, None), (signal, float(t["loss_mask"].sum()))):
        model = tiny_policy()
        # SGD: the parameters move by the gradient itself (AdamW would turn float noise in a near-zero
        # gradient into a full-size step)
        grpo_step(model, torch.optim.SGD(trainable(model), lr=1.0), rows, epochs=2, tokens=tokens)
        updated.append(torch.cat([p.detach().flatten() for p in trainable(model)]))
    start = torch.cat([p.detach().flatten() for p in trainable(tiny_policy())])
    assert float((updated[0] - start).abs().max()) > 1e-4  # the step moved the weights
    assert torch.allclose(updated[0], updated[1], atol=1e-6)


def test_a_batch_without_spread_has_no_rows_to_train() -> None:
    t = batch()
    t["sequence_advantages"] = torch.zeros(4)
    assert with_signal(t) is None


def test_a_dropped_flat_group_leaves_the_loss_to_the_groups_with_spread() -> None:
    t = batch()
    signal = with_signal(t)
    assert signal is not None
    moved = []
    for tokens in (float(t["loss_mask"].sum()), None):  # keep: the whole batch's tokens; drop: the signal rows'
        model = tiny_policy()
        start = torch.cat([p.detach().flatten() for p in trainable(model)])
        grpo_step(model, torch.optim.SGD(trainable(model), lr=1.0), signal, epochs=1, tokens=tokens)
        moved.append(torch.cat([p.detach().flatten() for p in trainable(model)]) - start)
    # one epoch of SGD: the update is the gradient, which the token count scales
    ratio = float(signal["loss_mask"].sum()) / float(t["loss_mask"].sum())
    assert torch.allclose(moved[0], moved[1] * ratio, atol=1e-6)
