"""A batch as prime-rl's training samples: one `TrainingSample` per trace.

The fields, pinned to PrimeIntellect-ai/prime-rl 559b44772e471d1538537b8805cc77f3824a5e64,
src/prime_rl/transports/rollouts/types.py (`class TrainingSample(msgspec.Struct)`): no prompt/response split,
four per-token streams as long as `token_ids`: `mask` (True on the sampled tokens), `logprobs` (the behaviour
logprob there, 0.0 elsewhere), `temperatures` (what each token was sampled at), `advantages` (the session's
group advantage on the sampled tokens, 0.0 elsewhere), and `env_name`.

    from prime_rl.transports.rollouts.types import TrainingSample
    samples = to_prime_rl(batch, TrainingSample, env_name="my-job")
"""

from __future__ import annotations

from typing import Any

from tracefleet.trainer.bridges.rows import Rollout, trained_rollouts

PINNED = ("PrimeIntellect-ai/prime-rl", "559b44772e471d1538537b8805cc77f3824a5e64",
          "src/prime_rl/transports/rollouts/types.py")
FIELDS = ("token_ids", "mask", "logprobs", "temperatures", "env_name", "ref_logprobs", "mm_kwargs", "routed_experts",
          "mm_token_type_ids", "rl_weights", "ce_weights", "ref_kl_weights", "advantages")


def training_sample(r: Rollout, env_name: str) -> dict[str, Any]:
    """One trace as TrainingSample's keyword arguments."""
    return {
        "token_ids": r.tokens,
        "mask": [bool(m) for m in r.loss_mask],
        "logprobs": r.logprobs,
        "temperatures": r.temperatures,
        "env_name": env_name,
        "advantages": [r.advantage if m else 0.0 for m in r.loss_mask],
    }


def to_prime_rl(batch: Any, sample_cls: Any = None, *, env_name: str = "", **options: Any) -> list[Any]:
    """The batch's trainable traces, groups of fewer than two sessions left out, as `sample_cls` instances
    (prime-rl's TrainingSample) or, without one, their keyword arguments: one per `rows.trained_rollouts(batch)`,
    in its order (a TrainingSample has no room for the session id)."""
    out = [training_sample(r, env_name) for r in trained_rollouts(batch, **options)]
    return out if sample_cls is None else [sample_cls(**o) for o in out]
