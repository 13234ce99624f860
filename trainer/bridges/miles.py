"""A batch as Miles' rollout samples (radixark/miles, the slime lineage): one `Sample` per trace.

The fields, pinned to radixark/miles 31f1ca961a94cb860cec3b2dea34ec332bfa8f76, miles/utils/types.py
(`@dataclass class Sample`): `group_index` and `index` (ints: the group's and the sample's place in the batch),
`rollout_id` (shared by the traces of one session, "so the rollout is counted once"), `tokens` (prompt and
response), `response_length`, `loss_mask` and `rollout_log_probs` (over the response only: 1 / the behaviour
logprob on the sampled tokens, 0 on tool results and harness text), `reward`, `weight_versions` (the policy
version of each call, as strings), `status` (a `Sample.Status` value) and `metadata`. The released miles-rl
0.0.2's Sample has no `rollout_id` and names the session in `session_id`: a class gets the fields it has
(tests/trainer/test_bridges_adapters.py builds 0.0.2's own).

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
# what a trainer needs of a Sample: both the pinned commit's and the released miles-rl 0.0.2's have them
NEEDED = ("group_index", "index", "tokens", "response_length", "loss_mask", "rollout_log_probs", "reward",
          "weight_versions", "status", "metadata")
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
    (Miles' Sample, its status a `Sample.Status`) or, without one, their keyword arguments (the pinned commit's
    fields). The released miles-rl 0.0.2's Sample has no `rollout_id` but a `session_id`: each gets what its
    class has (`samples_of`)."""
    out, sessions = [], {}
    for g, group in enumerate(groups(batch, **options)):
        for r in group:
            fields = sample_fields(r, g, len(out), sessions.setdefault(r.session_id, len(sessions)))
            out.append(fields | {"session_id": r.session_id})
    if sample_cls is None:
        return [{k: v for k, v in o.items() if k in FIELDS} for o in out]
    return samples_of(sample_cls, out)


def samples_of(sample_cls: Any, fields: list[dict[str, Any]]) -> list[Any]:
    """`sample_cls` instances of the keyword arguments, each given only the fields its class has; ValueError in one
    line when it lacks one a trainer needs (a Miles older than these fields)."""
    import dataclasses

    known = {f.name for f in dataclasses.fields(sample_cls)}
    missing = [f for f in NEEDED if f not in known]
    if missing:
        raise ValueError(f"{sample_cls.__module__}.{sample_cls.__name__} has no {', '.join(missing)}: the bridge needs "
                         f"miles-rl 0.0.2 or radixark/miles at {PINNED[1][:12]} or later")
    return [sample_cls(**{k: (sample_cls.Status(v) if k == "status" else v) for k, v in o.items() if k in known})
            for o in fields]
