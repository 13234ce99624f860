"""A batch as Miles' rollout samples (radixark/miles, the slime lineage): one `Sample` per trace.

The fields, pinned to radixark/miles 31f1ca961a94cb860cec3b2dea34ec332bfa8f76, miles/utils/types.py
(`@dataclass class Sample`): `group_index` and `index` (ints: the group's and the sample's place in the batch),
`rollout_id` (shared by the traces of one session, "so the rollout is counted once"), `tokens` (prompt and
response), `response_length`, `loss_mask` and `rollout_log_probs` (over the response only: 1 / the behaviour
logprob on the sampled tokens, 0 on tool results and harness text), `reward`, `weight_versions` (the policy
version of each call, as strings), `status` (a `Sample.Status` value) and `metadata`.

    from miles.utils.types import Sample
    samples = to_miles(batch, Sample)
"""

from __future__ import annotations

from typing import Any

from tracefleet.trainer.bridges.rows import Rollout, groups

PINNED = ("radixark/miles", "31f1ca961a94cb860cec3b2dea34ec332bfa8f76", "miles/utils/types.py")
FIELDS = ("group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs", "multimodal_train_inputs",
          "response", "response_length", "label", "reward", "loss_mask", "weight_versions", "rollout_log_probs",
          "rollout_routed_experts", "rollout_indexer_topk", "remove_sample", "teacher_log_probs", "opd_reverse_kl",
          "status", "metadata", "generate_function_path", "train_metadata", "adapter", "reward_spec", "routing_key",
          "non_generation_time", "spec_info", "prefix_cache_info")
# Sample.Status values by the last call's finish reason
STATUS = {"stop": "completed", "tool_calls": "completed", "length": "truncated", "abort": "aborted"}


def sample_fields(r: Rollout, group_index: int, index: int, rollout_id: int) -> dict[str, Any]:
    """One trace as Sample's keyword arguments (`status` as the Status value)."""
    return {
        "group_index": group_index, "index": index, "rollout_id": rollout_id,
        "tokens": r.tokens,
        "response_length": len(r.tokens) - r.prompt_length,
        "loss_mask": r.response_mask,
        "rollout_log_probs": r.response_logprobs,
        "reward": r.reward,
        "weight_versions": [str(v) for v in r.policy_versions],
        "status": STATUS.get(r.finish_reason or "", "completed"),
        "metadata": {"group_id": r.group_id, "session_id": r.session_id, "trace_id": r.trace_id,
                     "advantage": r.advantage},
    }


def to_miles(batch: Any, sample_cls: Any = None, **options: Any) -> list[Any]:
    """The batch's trainable traces, groups of fewer than two sessions left out, as `sample_cls` instances
    (Miles' Sample, its status a `Sample.Status`) or, without one, their keyword arguments."""
    out, sessions = [], {}
    for g, group in enumerate(groups(batch, **options)):
        for r in group:
            out.append(sample_fields(r, g, len(out), sessions.setdefault(r.session_id, len(sessions))))
    if sample_cls is None:
        return out
    return [sample_cls(**{**o, "status": sample_cls.Status(o["status"])}) for o in out]
