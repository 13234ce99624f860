"""The warm start is a function of the demonstrations and the seed, not of the order their sessions finished in:
the same sealed demonstrations, sealed in another order and split into other batches (as two recordings of the
same tasks seal them), give the same rows in the same order (tracefleet.trainer.demos.tensors), and the same
seed then trains them to the same NLL and the same weights (tracefleet.trainer.grpo.sft). With `decay` (`--warm-schedule
linear`) its learning rate falls linearly to 0 over the updates of all its epochs."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tracefleet.bucket import open_bucket  # noqa: E402
from tracefleet.trainer import demos  # noqa: E402
from tracefleet.trainer.grpo import sft, trainable  # noqa: E402

from fixtures.sealed_jobs import synthetic_traces, write_batches  # noqa: E402
from fixtures.tiny_llama import tiny_policy  # noqa: E402

JOB = "harness-train-demos"
VOCAB = 4096  # synthetic_traces draws token ids below it


def sealed(folder: Path, order_seed: int, per_batch: int) -> demos.DemoSet:
    """The same 24 demonstrations (some unrewarded, as `--accept` would have dropped), sealed in a shuffled order."""
    traces = synthetic_traces(0, 24, job=JOB, samples=2, prompt=12, completion=6)
    random.Random(order_seed).shuffle(traces)
    write_batches(open_bucket(str(folder / "batches")), JOB, traces, per_batch)
    return demos.find(folder)


def test_demonstrations_sealed_in_another_order_give_the_same_warm_start(tmp_path: Path) -> None:
    first, second = sealed(tmp_path / "a", 1, 8), sealed(tmp_path / "b", 2, 5)
    a, b = demos.tensors(demos.rewarded(first)), demos.tensors(demos.rewarded(second))
    assert 0 < a["input_ids"].shape[0] < 24  # the unrewarded ones left out
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))

    trained = []
    for t in (a, b):
        policy = tiny_policy(VOCAB)
        stats = sft(policy, torch.optim.AdamW(trainable(policy), lr=0.01), t, epochs=2, seed=3)
        trained.append((stats["nll"], torch.cat([p.detach().flatten() for p in trainable(policy)])))
    assert trained[0][0] == trained[1][0]
    assert torch.equal(trained[0][1], trained[1][1])


def test_a_decayed_warm_start_brings_its_rate_down_to_nothing_over_every_epoch(tmp_path: Path) -> None:
    t = demos.tensors(demos.rewarded(sealed(tmp_path, 1, 8)))
    updates = 2 * math.ceil(int(t["input_ids"].shape[0]) / 2)  # two epochs of two rows an update
    for decay, expected in ((True, [0.01 * (1 - k / updates) for k in range(updates)]), (False, [0.01] * updates)):
        policy = tiny_policy(VOCAB)
        optimizer = torch.optim.AdamW(trainable(policy), lr=0.01)
        rates: list[float] = []
        optimizer.register_step_pre_hook(lambda opt, args, kwargs, _rates=rates: _rates.append(opt.param_groups[0]["lr"]))
        sft(policy, optimizer, t, epochs=2, rows_per_update=2, seed=3, decay=decay)
        assert rates == pytest.approx(expected), decay
