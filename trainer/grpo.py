"""The reference trainer: a real policy (SmolLM2-135M-Instruct in the Hugging Face form the vLLM conversion
makes, tracefleet.engine.vllm_model) trained by torch on CPU with GRPO from `BatchReader.follow()`, its new
weights put back into the running job's engine(s) by `update_policy` after every step.

    python -m tracefleet.trainer.grpo --bucket ./batches --job my-job --engine http://127.0.0.1:8000 \\
        --model ~/.cache/tracefleet/vllm/models/smollm2-... --out ./ckpt --max-lag 1

The estimator, per trainable token t of a trace with group advantage A (tracefleet.contract.semantics):

    b_t  the engine's logprob of the token (the behaviour policy: vLLM runs --logprobs-mode processed_logprobs,
         the distribution that sampled it, after temperature)
    p_t  the trainer's logprob of the same token under the weights it holds before the step (no gradient), at
         the temperature the token was sampled at
    q_t  the same under the weights being trained
    r_t = exp(q_t - p_t)                    the PPO ratio against the trainer's own old policy, clipped to 1 +- eps
    w_t = min(exp(p_t - b_t), C)            truncated importance sampling (TIS): corrects for what sampled the token
                                            being the engine (other kernels, maybe older weights: asynchronous
                                            rollouts within `max_lag` versions), capped at C for variance
    loss = -sum_t w_t * min(r_t A, clip(r_t) A) / number of trainable tokens

With `epochs` E > 1 the step makes E optimizer updates over the batch, p_t and w_t fixed at the first pass's
values: from the second pass on r_t moves away from 1 and the clip stops a token's gradient once the policy
has moved it by more than eps in the direction of its advantage (PPO's epochs; the loop's default is 2).

With a `reference` (the trained tensors as they were at the warm start) and `kl_coef` beta > 0 the loss also
holds beta times the KL divergence of the policy from the reference over the same tokens, by the per-token
estimator exp(ref_t - q_t) - (ref_t - q_t) - 1 (non-negative, 0 where they agree; DeepSeekMath's GRPO): it pulls
back a policy that GRPO's few-group batches move away from what the warm start taught (measured in
docs/training/real-harness.md: without it the held-out sessions' tools collapse onto one).

With a `target_kl` K > 0 the step measures how far it moved the policy: the mean per trainable token of
KL(p || q) by the estimator (r_t - 1) - log r_t (r_t as above, after the update; the tokens were sampled near p).
A pass that finds it above KL_STOP * K makes no further update (PPO's early stop), and the loop adapts its next
learning rate to hold the step near K (tracefleet.trainer.step_size).

Every step reports the train/inference mismatch over its trainable tokens: mean and max |p_t - b_t| and the
mean, min, max of exp(p_t - b_t) and the share of tokens capped. Tokens sampled more than `max_lag` versions
behind the newest are masked out of the loss by the reader (asynchrony with a staleness bound).
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from tracefleet.traces import BatchReader
from tracefleet.traces.reader import take_rows

from tracefleet.trainer.control import engine_version, update_policy
from tracefleet.trainer.step_size import KL_STOP

DEFAULT_CLIP = 0.2
DEFAULT_TIS_CAP = 2.0
# frozen_prefix runs the leading tokens every row shares once when there are at least this many (below, a cache
# costs more than it saves)
SHARED_MIN_TOKENS = 32
SFT_PREFIX_ROWS = 8  # demonstrations whose frozen layers run together (frozen_prefix): their shared prompt once


def load_policy(model_dir: str | Path, train_layers: int | None = None) -> Any:
    """The causal LM in `model_dir` (float32: what the engine runs on CPU), in training mode. A tied
    embedding (SmolLM2: the output head is the input embedding) is frozen: vLLM 0.32's in-place reload
    updates the input embedding but keeps the output head it started with (measured on the CPU build: a 1%
    change of the tied matrix gives max |d logprob| 0.15 between trainer and engine, 2e-5 once the head is
    left as it was), so training it would make the engine sample from weights the trainer does not hold.
    `train_layers`: only the top N decoder layers and the final norm are trained (the backward pass stops
    there and a checkpoint holds only them: what makes a step and a sync affordable on 2 CPU cores)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    train_top(model, train_layers)
    model.train()
    return model


def train_top(model: Any, layers: int | None) -> Any:
    """`model` with only its top `layers` decoder layers and the final norm trained (None: every parameter), the
    tied embedding frozen either way (load_policy). Set again on a trained model, it changes which tensors the
    next steps train and a checkpoint holds: the warm start may train more layers than GRPO's steps (--warm-layers),
    whose checkpoints then carry only their own layers, the engine keeping the warm start's below them."""
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    stack = model.base_model.layers
    keep = None if layers is None else {f"layers.{i}." for i in range(max(0, len(stack) - layers), len(stack))}
    embedding = model.get_input_embeddings().weight
    for name, param in model.named_parameters():
        trained = keep is None or any(k in name for k in keep) or name.endswith("model.norm.weight")
        param.requires_grad_(trained and not (tied and param is embedding))
    return model


def trainable(model: Any) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: torch.Tensor | float = 1.0, mask: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T]: log p(token_t | tokens_<t) under `model`'s logits divided by the temperature token t was
    sampled at ([B, T] or a number); 0 at t = 0, which nothing predicts. With `mask` ([B, T]), only the
    positions where it is > 0 are computed (0 elsewhere): the output head and softmax run over the
    vocabulary (49k for SmolLM2) only for the sampled tokens, not for every prompt token."""
    if mask is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
        if isinstance(temperature, torch.Tensor):
            logits = logits / temperature[:, 1:, None]
        elif temperature != 1.0:
            logits = logits / temperature
        lp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        return torch.nn.functional.pad(lp, (1, 0))
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return _head_logprobs(model, hidden, input_ids, temperature, mask)


def _head_logprobs(model: Any, hidden: torch.Tensor, input_ids: torch.Tensor, temperature: torch.Tensor | float,
                   mask: torch.Tensor) -> torch.Tensor:
    """[B, T]: the output head and log-softmax over the vocabulary at the positions where mask > 0 only."""
    on = mask[:, 1:] > 0  # position t-1's hidden state predicts token t
    logits = model.get_output_embeddings()(hidden[:, :-1][on]).float()
    if isinstance(temperature, torch.Tensor):
        logits = logits / temperature[:, 1:][on][:, None]
    elif temperature != 1.0:
        logits = logits / temperature
    picked = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:][on][:, None]).squeeze(-1)
    out = torch.zeros(input_ids.shape, dtype=picked.dtype)
    out[:, 1:][on] = picked
    return out


def mismatch(trainer_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor, cap: float = DEFAULT_TIS_CAP) -> dict[str, float]:
    """Train/inference mismatch over the positions where mask > 0 (see the module docstring)."""
    on = mask > 0
    if not bool(on.any()):
        return {"tokens": 0}
    delta = (trainer_lp - engine_lp)[on].double()
    ratio = delta.exp()
    return {"tokens": int(on.sum()), "mean_abs_dlogprob": float(delta.abs().mean()), "max_abs_dlogprob": float(delta.abs().max()),
            "ratio_mean": float(ratio.mean()), "ratio_min": float(ratio.min()), "ratio_max": float(ratio.max()),
            "ratio_capped_share": float((ratio > cap).double().mean())}


def trained_from(model: Any) -> int:
    """The index of the lowest decoder layer with a trained parameter (0 when the embedding is trained or
    nothing is frozen): the layers below it and the embedding give the same hidden states at every pass."""
    if any(p.requires_grad for p in model.get_input_embeddings().parameters()):
        return 0
    for i, layer in enumerate(model.base_model.layers):
        if any(p.requires_grad for p in layer.parameters()):
            return i
    return len(model.base_model.layers)


@contextmanager
def _decoder_span(model: Any, start: int, stop: int | None, norm: bool) -> Iterator[Any]:
    """`model.base_model` running only decoder layers [start, stop), with or without its final norm: the
    model's own forward (its causal mask, rotary positions and attention kernels) on part of the stack. Each
    layer's attention reads and writes the KV cache at its place in the span, so a span that starts above layer 0
    keeps a cache of its own (whose length the model reads from the cache's first layer) as the whole model does."""
    base = model.base_model
    layers, final_norm = base.layers, base.norm
    span = list(layers)[start:stop]
    places = [layer.self_attn.layer_idx for layer in span]
    base.layers = torch.nn.ModuleList(span)
    for place, layer in enumerate(span):
        layer.self_attn.layer_idx = place
    if not norm:
        base.norm = torch.nn.Identity()
    try:
        yield base
    finally:
        for place, layer in zip(places, span):
            layer.self_attn.layer_idx = place
        base.layers, base.norm = layers, final_norm


def shared_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """How many leading tokens every row has, the same in each (a harness's system prompt)."""
    same = (input_ids == input_ids[:1]).all(0) & (attention_mask > 0).all(0)
    return int(same.long().cumprod(0).sum())


def frozen_prefix(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor | None:
    """[B, T, H]: the hidden states entering the lowest trained layer, computed once without a graph (they do
    not change while the frozen layers below it stay frozen); None when the whole stack is trained.

    The leading tokens all rows share (SHARED_MIN_TOKENS or more: the sessions of one harness send the same
    system prompt, ~1.5k of Pi's ~1.6k first-prompt tokens) are run once, and each row's own tokens after them
    attend to that run's keys and values (the model's own cache), not to a recomputation per row. The hidden
    states agree with a whole pass per row to float rounding (tests/trainer/test_grpo_step.py)."""
    split = trained_from(model)
    if split == 0:
        return None
    with torch.no_grad(), _decoder_span(model, 0, split, norm=False) as bottom:
        return _shared_run(bottom, shared_tokens(input_ids, attention_mask), input_ids, attention_mask)


def cache_argument(model: Any) -> str:
    """What `model`'s forward calls its KV cache, argument and output alike: transformers 5 names it `cache`, earlier
    releases (pyproject allows 4.46+) `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _shared_run(span: Any, shared: int, input_ids: torch.Tensor | None, attention_mask: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T, H]: `span`'s (_decoder_span) last hidden states from the rows' token ids, or from the hidden states
    entering it, the rows' first `shared` positions run once for all of them when that is worth it
    (SHARED_MIN_TOKENS), their keys and values repeated for each row's own tokens after them. Under a graph the
    gradient through the shared positions is every row's summed, as running each row whole gives."""
    x = input_ids if inputs_embeds is None else inputs_embeds
    feed = "input_ids" if inputs_embeds is None else "inputs_embeds"
    rows, length = int(x.shape[0]), int(x.shape[1])
    if shared < SHARED_MIN_TOKENS or rows < 2 or shared == length or not _uniform_attention(span):
        return span(**{feed: x}, attention_mask=attention_mask).last_hidden_state
    head = span(**{feed: x[:1, :shared]}, use_cache=True)
    name = cache_argument(span)
    cache = getattr(head, name)
    cache.batch_repeat_interleave(rows)
    tail = span(**{feed: x[:, shared:]}, attention_mask=attention_mask, use_cache=False, **{name: cache})
    return torch.cat([head.last_hidden_state.expand(rows, -1, -1), tail.last_hidden_state], dim=1)


def _uniform_attention(base: Any) -> bool:
    """Whether every layer attends over the whole context (SmolLM2, Llama): a span's cache then needs no layer
    types of its own (a sliding window's layers would, so such a model runs its rows whole)."""
    config = base.config
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    return kinds == {"full_attention"} and getattr(config, "sliding_window", None) is None


def sampled_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor,
                     temperature: torch.Tensor | float, prefix: torch.Tensor | None) -> torch.Tensor:
    """`token_logprobs(..., mask)`, from `prefix` (frozen_prefix) through the trained layers only when given, else
    from the token ids through the whole model. The leading tokens every row shares run through the trained layers
    once too (_shared_run, with their graph): a GRPO step's rows are one harness's sessions, ~1.5k shared tokens of
    Pi's ~1.7k, so a row costs its own tokens only."""
    shared = shared_tokens(input_ids, attention_mask)
    with _decoder_span(model, 0 if prefix is None else trained_from(model), None, norm=True) as top:
        hidden = _shared_run(top, shared, input_ids if prefix is None else None, attention_mask, prefix)
    return _head_logprobs(model, hidden, input_ids, temperature, mask)


def grpo_step(model: Any, optimizer: torch.optim.Optimizer, t: dict[str, torch.Tensor], *,
              temperature: torch.Tensor | float | None = None,
              clip: float = DEFAULT_CLIP, tis_cap: float = DEFAULT_TIS_CAP,
              policy_version: int | None = None, epochs: int = 1, tokens: float | None = None,
              reference: dict[str, torch.Tensor] | None = None, kl_coef: float = 0.0,
              target_kl: float = 0.0, demos: dict[str, torch.Tensor] | None = None,
              demo_coef: float = 0.0) -> dict[str, float]:
    """One GRPO step with the TIS correction over the reader's tensors (`Batch.tensors()`); its stats.
    `temperature` None: each token's own, as its span records it (the reader's `temperatures`).
    `policy_version`: the version of the weights the trainer holds before the step; the mismatch is then also
    given over the tokens that version sampled (`same_version_*`: the engine's kernels against torch's, with
    no policy lag in it).
    `epochs`: optimizer updates over the batch (PPO epochs). The first pass's logprobs are the old policy p_t
    of every pass, so from the second on the ratio r_t moves and its clip bounds how far one batch can pull
    the policy; the frozen layers' hidden states are computed once for all passes (frozen_prefix), so a
    further pass costs only the trained layers' forward and backward.
    `tokens`: what the loss is divided by (default: the trainable tokens of `t`): the whole batch's count when
    `t` holds only its rows with a non-zero advantage (tracefleet.trainer.loop.with_signal), so the gradient is
    the whole batch's.
    `reference`, `kl_coef`: the KL penalty above (`reference_weights` makes the reference); `kl` in the stats is
    the first pass's mean estimate per trainable token.
    `target_kl`: measure the step (`step_kl`, the KL of the weights after it from those before, per trainable token)
    and stop its passes early once that passes KL_STOP times it; `updates` is how many it made.
    `demos`, `demo_coef`: every pass's loss also holds demo_coef times the mean NLL per token of the demonstrations'
    completions (their loss mask; at temperature 1, as the warm start trained them), a term of its own beside
    GRPO's (tracefleet.trainer.demo_mix); `demo_nll` in the stats is the first pass's."""
    if epochs < 1:
        raise ValueError("epochs must be at least 1")
    if kl_coef and reference is None:
        raise ValueError("a KL penalty needs the reference weights")
    if demo_coef and demos is None:
        raise ValueError("a demonstration term needs the demonstrations")
    if temperature is None:
        temperature = t.get("temperatures", 1.0)
    ids, attention = t["input_ids"], t["attention_mask"]
    mask, adv, engine_lp = t["loss_mask"], t["advantages"], t["old_logprobs"]
    prefix = frozen_prefix(model, ids, attention)
    n = mask.sum().clamp(min=1) if tokens is None else torch.tensor(max(tokens, 1.0))
    demo_prefix = frozen_prefix(model, demos["input_ids"], demos["attention_mask"]) if demo_coef else None
    ref = None
    if kl_coef:
        with torch.no_grad(), holding(model, reference or {}):
            ref = sampled_logprobs(model, ids, attention, mask, temperature, prefix)
    old = weight = None
    stats: dict[str, float] = {}
    losses, clipped = [], []
    for _ in range(epochs):
        new = sampled_logprobs(model, ids, attention, mask, temperature, prefix)
        if old is not None and target_kl:
            stats["step_kl"] = step_kl(old, new.detach(), mask)
            if stats["step_kl"] > KL_STOP * target_kl:
                break  # this pass's weights have moved far enough: no further update on this batch
        if old is None:
            # the first pass's weights are the ones before the step: their logprobs, detached, are p_t
            old = new.detach()
            stats = mismatch(old, engine_lp, mask, tis_cap)
            if policy_version is not None and "token_versions" in t:
                same = mismatch(old, engine_lp, mask * (t["token_versions"] == policy_version), tis_cap)
                stats.update({f"same_version_{k}": v for k, v in same.items() if k in ("tokens", "mean_abs_dlogprob", "max_abs_dlogprob")})
            weight = torch.exp(old - engine_lp).clamp(max=tis_cap) * mask
        ratio = torch.exp(new - old)
        objective = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
        loss = -(weight * objective).sum() / n
        if ref is not None:
            diff = (ref - new) * mask  # 0 off the mask, where the estimator is then 0 too
            kl = torch.exp(diff) - diff - 1
            if len(losses) == 0:
                stats["kl"] = float(kl.detach().sum() / mask.sum().clamp(min=1))
            loss = loss + kl_coef * kl.sum() / n
        if demo_coef:
            demo_nll = demo_loss(model, demos, demo_prefix)  # type: ignore[arg-type]
            if len(losses) == 0:
                stats["demo_nll"] = float(demo_nll.detach())
            loss = loss + demo_coef * demo_nll
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        clipped.append(float((((ratio - 1).abs() > clip) * mask).sum() / mask.sum().clamp(min=1)))
    if target_kl and len(losses) == epochs:
        with torch.no_grad():  # every pass updated: the last update's weights measured once more
            stats["step_kl"] = step_kl(old, sampled_logprobs(model, ids, attention, mask, temperature, prefix), mask)
    stats.update({"loss": losses[0], "loss_last": losses[-1], "epochs": epochs, "updates": len(losses),
                  "clipped_share": clipped[-1]})
    return stats


def demo_loss(model: Any, demos: dict[str, torch.Tensor], prefix: torch.Tensor | None) -> torch.Tensor:
    """The mean NLL per token of the demonstrations' completions, with its graph (sft's loss)."""
    mask = demos["loss_mask"]
    lp = sampled_logprobs(model, demos["input_ids"], demos["attention_mask"], mask, 1.0, prefix)
    return -(lp * mask).sum() / mask.sum().clamp(min=1)


def step_kl(old: torch.Tensor, new: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean per trainable token of KL(old || new), by the estimator (r - 1) - log r with r = exp(new - old):
    non-negative, 0 where the two agree, unbiased for tokens sampled from `old` (Schulman's k3)."""
    log_ratio = (new - old) * mask
    k3 = torch.exp(log_ratio) - 1 - log_ratio
    return float((k3 * mask).sum() / mask.sum().clamp(min=1))


def reference_weights(model: Any) -> dict[str, torch.Tensor]:
    """A copy of the tensors being trained as they are now: the KL penalty's reference (grpo_step)."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


@contextmanager
def holding(model: Any, weights: dict[str, torch.Tensor]) -> Iterator[None]:
    """The model with `weights` in place of its own tensors of those names, its own put back after."""
    params = dict(model.named_parameters())
    own = {name: params[name].detach().clone() for name in weights}
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)
    try:
        yield
    finally:
        with torch.no_grad():
            for name, value in own.items():
                params[name].copy_(value)


def sft(model: Any, optimizer: torch.optim.Optimizer, t: dict[str, torch.Tensor], *, epochs: int = 3,
        rows_per_update: int = 2, seed: int = 0, decay: bool = False, log: Any = None) -> dict[str, Any]:
    """Supervised warm start on demonstrations (the reader's tensors of their traces): the negative log-likelihood
    of the tokens the loss mask marks (the completions the engine sampled; the harness's text and the tool results
    are context only), at temperature 1, averaged per token over `rows_per_update` rows per optimizer update.
    Each row's frozen layers run once for every epoch (frozen_prefix, SFT_PREFIX_ROWS rows at a time), and an
    update's rows run together through the trained layers, their shared prompt once (sampled_logprobs). `decay`: the
    optimizer's learning rate falls linearly to 0 over the updates of all epochs (else it stays). Returns the mean
    NLL per token of each epoch (`nll`, measured while training) and what was trained on."""
    if epochs < 1:
        raise ValueError("epochs must be at least 1")
    rows = []
    keep = [i for i in range(int(t["input_ids"].shape[0])) if float(t["loss_mask"][i].sum())]
    for start in range(0, len(keep), SFT_PREFIX_ROWS):
        chunk = keep[start:start + SFT_PREFIX_ROWS]
        prefixes = frozen_prefix(model, t["input_ids"][chunk], t["attention_mask"][chunk])
        for j, i in enumerate(chunk):
            n = int(t["attention_mask"][i].sum())
            rows.append((t["input_ids"][i:i + 1, :n], t["attention_mask"][i:i + 1, :n], t["loss_mask"][i:i + 1, :n],
                         None if prefixes is None else prefixes[j:j + 1, :n]))
    if not rows:
        raise ValueError("no demonstration has a trainable token")
    order = torch.Generator().manual_seed(seed)
    updates = epochs * -(-len(rows) // rows_per_update)
    rate = torch.optim.lr_scheduler.LambdaLR(optimizer, (lambda k: 1.0 - k / updates) if decay else (lambda k: 1.0))
    nll: list[float] = []
    for epoch in range(epochs):
        total = count = 0.0
        perm = torch.randperm(len(rows), generator=order).tolist()
        for start in range(0, len(perm), rows_per_update):
            chunk = [rows[j] for j in perm[start:start + rows_per_update]]
            ids, att, mask, prefix = _padded(chunk)
            n = float(mask.sum())
            optimizer.zero_grad()
            loss = demo_loss(model, {"input_ids": ids, "attention_mask": att, "loss_mask": mask}, prefix)
            loss.backward()
            total += float(loss.detach()) * n
            optimizer.step()
            rate.step()
            count += n
        nll.append(total / count)
        if log is not None:
            log(f"warm start epoch {epoch + 1}/{epochs}: NLL per token {nll[-1]:.4f} over {int(count)} tokens")
    return {"rows": len(rows), "tokens": int(sum(float(m.sum()) for _, _, m, _ in rows)), "epochs": epochs, "nll": nll}


def _padded(rows: list[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor | None, ...]:
    """One batch of rows kept at their own lengths (ids, attention, loss mask, frozen prefix or None), right-padded
    to the longest as the reader pads: attention and loss mask 0 after a row's end."""
    length = max(int(r[0].shape[1]) for r in rows)

    def pad(x: torch.Tensor) -> torch.Tensor:
        extra = length - int(x.shape[1])
        return torch.nn.functional.pad(x, (0, 0, 0, extra) if x.dim() == 3 else (0, extra))

    return tuple(None if rows[0][k] is None else torch.cat([pad(r[k]) for r in rows]) for k in range(4))


def save_weights(model: Any, out: Path) -> Path:
    """The trained tensors as a checkpoint directory vLLM's `reload_weights` reads (safetensors, the Hugging
    Face names): only those the trainer changes, the in-place reload keeping the rest (SmolLM2: 55 MB for the
    top four layers, 500 MB for the whole model, which the reload then reads and copies in full)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: p.detach().contiguous() for name, p in model.named_parameters() if p.requires_grad}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def train(bucket: str, job: str, engines: list[str], model_dir: str, out: Path, *, lr: float = 1e-5,
          max_lag: int = 1, steps: int | None = None, poll_s: float = 2.0, idle_exit: bool = False,
          start_version: int | None = None) -> list[dict[str, Any]]:
    """Follow the job's batches: one GRPO step per batch, new weights into the engines, the batch committed.
    One JSON-able record per step (its mismatch figures and the weight sync's seconds per step)."""
    model = load_policy(model_dir)
    optimizer = torch.optim.AdamW(trainable(model), lr=lr)
    reader = BatchReader(bucket, job, consumer="reference-trainer")
    # None: on from the engines' own label (control.engine_version), never back to 1 against an engine at N
    version, log = engine_version(engines) if start_version is None else start_version, []
    for batch in reader.follow(poll_s=poll_s, idle_exit=idle_exit):
        t0 = time.monotonic()
        tensors = batch.tensors(max_lag=max_lag)
        tensors = take_rows(tensors, tensors["trained"])  # no forward pass over rows out of the loss
        stats = grpo_step(model, optimizer, tensors) if tensors["input_ids"].shape[0] else {"tokens": 0}
        version += 1
        report = update_policy(engines, save_weights(model, out / f"policy-{version}"), version)
        reader.commit(batch)
        record = {"seq": batch.seq, "version": version, "rows": int(tensors["input_ids"].shape[0]),
                  "reward_mean": float(tensors["rewards"].mean()) if tensors["rewards"].numel() else None,
                  "train_s": round(time.monotonic() - t0 - report.seconds, 3), "sync": report.step_seconds(),
                  "sync_s": round(report.seconds, 3), "in_flight": [f.model_dump() for f in report.in_flight], **stats}
        print(json.dumps(record), flush=True)
        log.append(record)
        if steps is not None and len(log) >= steps:
            break
    return log


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracefleet.trainer.grpo", description=__doc__.splitlines()[0])
    p.add_argument("--bucket", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--engine", action="append", required=True, help="engine root URL (repeat for replicas)")
    p.add_argument("--model", required=True, help="the served model's Hugging Face directory")
    p.add_argument("--out", required=True, type=Path, help="where each step's checkpoint is written (the engines read it)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--max-lag", type=int, default=1)
    p.add_argument("--steps", type=int)
    p.add_argument("--idle-exit", action="store_true", help="stop when no new batch comes")
    a = p.parse_args(argv)
    train(a.bucket, a.job, a.engine, a.model, a.out, lr=a.lr, max_lag=a.max_lag, steps=a.steps, idle_exit=a.idle_exit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
