"""`--warm-layers`: the warm start may train more decoder layers than GRPO's steps. After it, the policy trains
only the top `--train-layers` (grpo.train_top): the layers below keep what the warm start taught them, the steps'
frozen pass runs through those warm-started layers, and a step's checkpoint holds only the top layers, so the
engine, which took the warm start's every layer as policy 1, keeps the rest as it has them."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.torch import load_file  # noqa: E402

from tracefleet.bucket import open_bucket  # noqa: E402
from tracefleet.trainer import demos  # noqa: E402

from tracefleet.trainer.grpo import (  # noqa: E402
    frozen_prefix,
    save_weights,
    sampled_logprobs,
    sft,
    token_logprobs,
    train_top,
    trained_from,
    trainable,
)

from fixtures.sealed_jobs import synthetic_traces, write_batches  # noqa: E402
from fixtures.tiny_llama import tiny_policy  # noqa: E402

VOCAB = 4096


def demonstrations(folder: Path) -> dict[str, torch.Tensor]:
    job = "harness-train-demos"
    write_batches(open_bucket(str(folder / "batches")), job, synthetic_traces(0, 8, job=job, samples=2, prompt=12,
                                                                               completion=6), 8)
    return demos.tensors(demos.rewarded(demos.find(folder)))


def saved_names(model: object, folder: Path) -> set[str]:
    return set(load_file(str(save_weights(model, folder) / "model.safetensors")))


def test_the_warm_start_trains_more_layers_and_grpo_then_only_its_own(tmp_path: Path) -> None:
    policy = train_top(tiny_policy(VOCAB), None)  # every layer but the tied embedding
    assert trained_from(policy) == 0 and not policy.get_input_embeddings().weight.requires_grad
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    t = demonstrations(tmp_path / "demos")
    sft(policy, torch.optim.AdamW(trainable(policy), lr=0.01), t, epochs=1, seed=0)
    warm = {n: p.detach().clone() for n, p in policy.named_parameters()}
    changed = {n for n in warm if not torch.equal(warm[n], before[n])}
    assert any(n.startswith("model.layers.0.") for n in changed)  # the bottom layer learned too
    assert "model.embed_tokens.weight" not in changed  # tied: the engine keeps its own output head
    warm_names = saved_names(policy, tmp_path / "policy-1")
    assert {n for n in warm_names if ".layers." in n} >= {n for n in changed if ".layers." in n}

    train_top(policy, 1)  # GRPO's layers: the top one and the final norm
    assert {n for n, p in policy.named_parameters() if p.requires_grad} == {
        n for n in warm if n.startswith("model.layers.2.")} | {"model.norm.weight"}
    assert all(torch.equal(p, warm[n]) for n, p in policy.named_parameters())  # nothing undone
    assert trained_from(policy) == 2
    step_names = saved_names(policy, tmp_path / "policy-2")
    assert step_names < warm_names and not any(".layers.0." in n or ".layers.1." in n for n in step_names)

    # the steps' frozen pass runs through the warm-started layers: the same logprobs as a whole forward pass
    ids, att, mask = t["input_ids"][:2], t["attention_mask"][:2], t["loss_mask"][:2]
    with torch.no_grad():
        whole = token_logprobs(policy, ids, att, 1.0, mask)
        split = sampled_logprobs(policy, ids, att, mask, 1.0, frozen_prefix(policy, ids, att))
    assert torch.allclose(whole, split, atol=1e-5)
