"""The reference trainer's step on a small Llama-shaped model (SmolLM2's architecture, random weights, made
here: no model is downloaded): the frozen layers' hidden states computed once, and a shared prompt run once
through every layer, give the logprobs and the gradient of the whole model, and several epochs over one batch
move only the trained tensors, with the PPO clip bounding how far. The real SmolLM2 against real vLLM: tests/vllm/test_vllm_policy_update.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tracefleet.trainer import grpo
from tracefleet.trainer.step_size import KL_STOP
from tracefleet.trainer.grpo import (SHARED_MIN_TOKENS, frozen_prefix, grpo_step, load_policy, sampled_logprobs,
                                     save_weights, sft, shared_tokens, token_logprobs, trainable, trained_from)

LAYERS = 6
TRAINED = 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def batch(rows: int = 4, length: int = 20) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (rows, length), generator=g)
    attention = torch.ones(rows, length, dtype=torch.long)
    attention[0, 15:] = 0  # a shorter row, right-padded as the reader pads
    mask = torch.zeros(rows, length)
    mask[:, 10:] = 1
    mask[0, 15:] = 0
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * mask
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": mask, "advantages": adv,
            "temperatures": torch.full((rows, length), 0.8), "old_logprobs": torch.zeros(rows, length)}


def test_the_frozen_prefix_gives_the_whole_models_logprobs(model_dir: Path) -> None:
    policy = load_policy(model_dir, TRAINED)
    assert trained_from(policy) == LAYERS - TRAINED and trained_from(load_policy(model_dir)) == 0
    t = batch()
    with torch.no_grad():
        whole = token_logprobs(policy, t["input_ids"], t["attention_mask"], t["temperatures"], t["loss_mask"])
        prefix = frozen_prefix(policy, t["input_ids"], t["attention_mask"])
        parts = sampled_logprobs(policy, t["input_ids"], t["attention_mask"], t["loss_mask"], t["temperatures"], prefix)
    assert prefix is not None and prefix.shape == (4, 20, 32)
    assert torch.equal(whole, parts)
    assert len(policy.base_model.layers) == LAYERS  # the model is whole again after each partial pass
    assert frozen_prefix(load_policy(model_dir), t["input_ids"], t["attention_mask"]) is None  # all trained


def test_a_shared_prompt_runs_once_and_gives_the_whole_models_logprobs(model_dir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows that begin with the same tokens (one harness's system prompt) share one run of them through the frozen
    layers (SHARED_MIN_TOKENS or more); their logprobs are the whole model's to float rounding."""
    policy = load_policy(model_dir, TRAINED)
    t = batch(length=60)
    t["input_ids"][:, :SHARED_MIN_TOKENS + 8] = t["input_ids"][0, :SHARED_MIN_TOKENS + 8]
    t["attention_mask"][0, 15:] = 1
    t["attention_mask"][0, 50:] = 0
    t["loss_mask"][:, 45:] = 1
    t["loss_mask"][0, 50:] = 0
    assert shared_tokens(t["input_ids"], t["attention_mask"]) >= SHARED_MIN_TOKENS + 8
    with torch.no_grad():
        whole = token_logprobs(policy, t["input_ids"], t["attention_mask"], t["temperatures"], t["loss_mask"])
        prefix = frozen_prefix(policy, t["input_ids"], t["attention_mask"])
        parts = sampled_logprobs(policy, t["input_ids"], t["attention_mask"], t["loss_mask"], t["temperatures"], prefix)
    assert prefix is not None and prefix.shape == (4, 60, 32)
    assert float((whole - parts).abs().max()) < 1e-5 and bool((parts[t["loss_mask"] > 0] != 0).all())
    assert len(policy.base_model.layers) == LAYERS
    assert [layer.self_attn.layer_idx for layer in policy.base_model.layers] == list(range(LAYERS))
    # the trained layers too run the shared prompt once, with its graph: the gradient is the one every row run
    # whole gives, and the top layer sees the shared positions once
    shared = shared_tokens(t["input_ids"], t["attention_mask"])
    seen: list[int] = []
    policy.base_model.layers[-1].register_forward_hook(
        lambda _m, args, _o: seen.append(int(args[0].shape[0] * args[0].shape[1])))
    grads, positions = [], []
    for least in (SHARED_MIN_TOKENS, 10**9):  # shared, then every row whole
        monkeypatch.setattr(grpo, "SHARED_MIN_TOKENS", least)
        policy.zero_grad()
        seen.clear()
        lp = sampled_logprobs(policy, t["input_ids"], t["attention_mask"], t["loss_mask"], t["temperatures"],
                              frozen_prefix(policy, t["input_ids"], t["attention_mask"]))
        positions.append(sum(seen))
        (-(lp * t["advantages"]).sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in trainable(policy)]))
    assert float(grads[0].abs().max()) > 0 and torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-6)
    assert positions == [shared + 4 * (60 - shared), 4 * 60]
    # a policy trained whole (no frozen layer) shares the prompt from layer 0 the same way
    whole_policy = load_policy(model_dir)
    monkeypatch.setattr(grpo, "SHARED_MIN_TOKENS", SHARED_MIN_TOKENS)
    with torch.no_grad():
        alone = token_logprobs(whole_policy, t["input_ids"], t["attention_mask"], t["temperatures"], t["loss_mask"])
        together = sampled_logprobs(whole_policy, t["input_ids"], t["attention_mask"], t["loss_mask"], t["temperatures"],
                                    None)
    assert float((alone - together).abs().max()) < 1e-5


def test_epochs_move_only_the_trained_tensors_and_the_clip_bounds_them(model_dir: Path, tmp_path: Path) -> None:
    policy = load_policy(model_dir, TRAINED)
    t = batch()
    with torch.no_grad():
        t["old_logprobs"] = token_logprobs(policy, t["input_ids"], t["attention_mask"], t["temperatures"])
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    stats = grpo_step(policy, torch.optim.AdamW(trainable(policy), lr=0.05), t, epochs=4)
    assert stats["epochs"] == 4 and stats["mean_abs_dlogprob"] < 1e-6  # the engine's logprobs were this policy's
    assert stats["clipped_share"] > 0 and stats["loss_last"] < stats["loss"]  # later passes moved, the clip held some
    moved = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    top = {f"model.layers.{i}." for i in range(LAYERS - TRAINED, LAYERS)}
    assert moved and all(any(n.startswith(k) for k in top) or n == "model.norm.weight" for n in moved), moved
    saved = save_weights(policy, tmp_path / "ckpt")
    from safetensors.torch import load_file

    assert set(load_file(str(saved / "model.safetensors"))) == {n for n, p in policy.named_parameters() if p.requires_grad}
    with pytest.raises(ValueError, match="epochs must be at least 1"):
        grpo_step(policy, torch.optim.AdamW(trainable(policy)), t, epochs=0)


def test_the_warm_start_learns_the_masked_tokens_only(model_dir: Path) -> None:
    policy = load_policy(model_dir, TRAINED)
    t = batch()
    stats = sft(policy, torch.optim.AdamW(trainable(policy), lr=0.05), t, epochs=20, rows_per_update=2)
    assert stats["rows"] == 4 and stats["tokens"] == int(t["loss_mask"].sum()) and len(stats["nll"]) == 20
    assert stats["nll"][-1] < stats["nll"][0] - 0.5, stats["nll"]
    with torch.no_grad():  # what the last pass measured is the policy's own NLL of the masked tokens, padding aside
        lp = token_logprobs(policy, t["input_ids"], t["attention_mask"], 1.0, t["loss_mask"])
    assert float(-(lp * t["loss_mask"]).sum() / t["loss_mask"].sum()) < stats["nll"][0]
    t["loss_mask"] = torch.zeros_like(t["loss_mask"])
    with pytest.raises(ValueError, match="no demonstration has a trainable token"):
        sft(policy, torch.optim.AdamW(trainable(policy)), t)


def test_the_kl_penalty_is_zero_at_the_reference_and_pulls_back_towards_it(model_dir: Path) -> None:
    t = batch()
    with_kl, without = load_policy(model_dir, TRAINED), load_policy(model_dir, TRAINED)
    reference = grpo.reference_weights(with_kl)
    assert set(reference) == {n for n, p in with_kl.named_parameters() if p.requires_grad}
    # at the reference the penalty and its gradient are 0: the first update is GRPO's alone
    stats = grpo_step(with_kl, torch.optim.SGD(trainable(with_kl), lr=0.5), t, reference=reference, kl_coef=1.0)
    grpo_step(without, torch.optim.SGD(trainable(without), lr=0.5), t)
    assert stats["kl"] == pytest.approx(0.0, abs=1e-9)
    for (name, a), b in zip(with_kl.named_parameters(), without.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name

    def kl_from_reference(model: torch.nn.Module) -> float:
        with torch.no_grad():
            q = token_logprobs(model, t["input_ids"], t["attention_mask"], t["temperatures"], t["loss_mask"])
            with grpo.holding(model, reference):
                ref = token_logprobs(model, t["input_ids"], t["attention_mask"], t["temperatures"], t["loss_mask"])
        diff = (ref - q) * t["loss_mask"]
        return float(((diff.exp() - diff - 1) * t["loss_mask"]).sum() / t["loss_mask"].sum())

    moved = kl_from_reference(with_kl)
    assert moved > 0  # GRPO's step moved the policy; holding() put the policy's own weights back
    assert kl_from_reference(with_kl) == moved
    # with no advantage left, the penalty alone pulls the policy back towards the reference
    still = t | {"advantages": torch.zeros_like(t["advantages"])}
    stats = grpo_step(with_kl, torch.optim.SGD(trainable(with_kl), lr=0.5), still, reference=reference, kl_coef=1.0,
                      epochs=3)
    assert stats["kl"] == pytest.approx(moved, rel=1e-4)
    assert kl_from_reference(with_kl) < moved / 2
    with pytest.raises(ValueError, match="reference"):
        grpo_step(with_kl, torch.optim.SGD(trainable(with_kl), lr=0.5), t, kl_coef=0.1)


def test_a_target_kl_measures_the_step_and_stops_its_passes_once_it_has_moved_far_enough(model_dir: Path) -> None:
    t = batch()
    with torch.no_grad():
        t["old_logprobs"] = token_logprobs(load_policy(model_dir, TRAINED), t["input_ids"], t["attention_mask"],
                                           t["temperatures"])

    def step(lr: float, target: float) -> tuple[dict[str, float], float]:
        policy = load_policy(model_dir, TRAINED)
        with torch.no_grad():
            before = token_logprobs(policy, t["input_ids"], t["attention_mask"], t["temperatures"], t["loss_mask"])
        stats = grpo_step(policy, torch.optim.AdamW(trainable(policy), lr=lr), t, epochs=3, target_kl=target)
        with torch.no_grad():
            after = token_logprobs(policy, t["input_ids"], t["attention_mask"], t["temperatures"], t["loss_mask"])
        return stats, grpo.step_kl(before, after, t["loss_mask"])

    # a small step: every pass updates, and step_kl is the KL of the weights after the last from those before
    small, moved = step(1e-4, 1.0)
    assert small["updates"] == small["epochs"] == 3
    assert 0 < small["step_kl"] == pytest.approx(moved, rel=1e-4)
    # a large step against a small target: the second pass measures the first update, past KL_STOP x the target,
    # and makes no further update; the step's KL is that first update's
    large, moved = step(0.05, 1e-6)
    assert large["updates"] == 1 and large["step_kl"] > KL_STOP * 1e-6
    assert large["step_kl"] == pytest.approx(moved, rel=1e-4)
    assert "step_kl" not in grpo_step(load_policy(model_dir, TRAINED),
                                      torch.optim.AdamW(trainable(load_policy(model_dir, TRAINED))), t)
    # KL(p || p) is 0 and the estimator never negative
    assert grpo.step_kl(t["old_logprobs"], t["old_logprobs"], t["loss_mask"]) == 0.0


def test_the_demonstration_term_lowers_their_nll_beside_grpos_and_needs_them(model_dir: Path) -> None:
    """--demo-mix: a term of its own, the demonstrations' mean NLL over their completions (sft's loss), that moves
    the policy towards them even when GRPO's batch has no advantage left."""
    t = batch()
    demos = batch(rows=4, length=24)
    policy = load_policy(model_dir, TRAINED)
    with torch.no_grad():
        before = float(grpo.demo_loss(policy, demos, None))
    still = t | {"advantages": torch.zeros_like(t["advantages"])}
    stats = grpo_step(policy, torch.optim.AdamW(trainable(policy), lr=0.01), still, epochs=3, demos=demos,
                      demo_coef=1.0)
    assert stats["demo_nll"] == pytest.approx(before, rel=1e-5)  # the first pass's, before any update
    with torch.no_grad():
        assert float(grpo.demo_loss(policy, demos, None)) < before - 0.01
    # without the term the same batch (no advantage) leaves the demonstrations' NLL where it was
    alone = load_policy(model_dir, TRAINED)
    assert "demo_nll" not in grpo_step(alone, torch.optim.SGD(trainable(alone), lr=0.01), still)
    with torch.no_grad():
        assert float(grpo.demo_loss(alone, demos, None)) == pytest.approx(before, rel=1e-6)
    with pytest.raises(ValueError, match="needs the demonstrations"):
        grpo_step(alone, torch.optim.SGD(trainable(alone), lr=0.01), t, demo_coef=1.0)


def test_a_warm_start_update_runs_its_rows_together_padded_and_measures_each_rows_own_nll(model_dir: Path) -> None:
    """An update's rows, of different lengths and sharing a prompt, run as one right-padded batch (the shared prompt
    once): the NLL it measures is the one of each row run alone at its own length."""
    policy = load_policy(model_dir, TRAINED)
    t = batch(length=60)
    t["input_ids"][:, :SHARED_MIN_TOKENS + 8] = t["input_ids"][0, :SHARED_MIN_TOKENS + 8]
    for i, end in enumerate((44, 60, 52, 57)):
        t["attention_mask"][i] = (torch.arange(60) < end).long()
        t["loss_mask"][i] = ((torch.arange(60) >= 42) & (torch.arange(60) < end)).float()
    with torch.no_grad():
        alone = [token_logprobs(policy, t["input_ids"][i:i + 1, :n], t["attention_mask"][i:i + 1, :n], 1.0,
                                t["loss_mask"][i:i + 1, :n]) for i, n in enumerate(t["attention_mask"].sum(1).tolist())]
    expected = -sum(float((lp * t["loss_mask"][i:i + 1, :lp.shape[1]]).sum()) for i, lp in enumerate(alone))
    stats = sft(policy, torch.optim.SGD(trainable(policy), lr=0.0), t, epochs=1, rows_per_update=2)
    assert stats["tokens"] == int(t["loss_mask"].sum())
    assert abs(stats["nll"][0] - expected / stats["tokens"]) < 1e-5
