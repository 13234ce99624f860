"""A batch as verl's agent-loop output: one `AgentLoopOutput` per trace, for an agent loop whose rollouts
tracefleet ran.

The fields, pinned to volcengine/verl b178a3cd56f58b2d502255daba591e92833930a7,
verl/experimental/agent_loop/agent_loop.py (`class AgentLoopOutput(BaseModel)`): `prompt_ids`, `response_ids`
(every token after the prompt: the sampled ones and the tool results between them), `response_mask` (1 on the
sampled tokens), `response_logprobs`, `reward_score`, `num_turns` (user, assistant and tool messages),
`metrics` (an `AgentLoopMetrics`: its defaults), `extra_fields`. verl groups a prompt's samples by its own
`uid`: tracefleet's group, session and trace ids and the advantage ride in `extra_fields`.

    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
    outputs = to_verl(batch, AgentLoopOutput)
"""

from __future__ import annotations

from typing import Any

from tracefleet.trainer.bridges.rows import Rollout, trained_rollouts

PINNED = ("volcengine/verl", "b178a3cd56f58b2d502255daba591e92833930a7", "verl/experimental/agent_loop/agent_loop.py")
FIELDS = ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "routed_experts", "multi_modal_data",
          "reward_score", "num_turns", "metrics", "extra_fields")


def agent_loop_output(r: Rollout) -> dict[str, Any]:
    """One trace as AgentLoopOutput's keyword arguments."""
    return {
        "prompt_ids": r.prompt_ids,
        "response_ids": r.response_ids,
        "response_mask": r.response_mask,
        "response_logprobs": r.response_logprobs,
        "reward_score": r.reward,
        # user message, then an assistant message per call with a tool result between two calls
        "num_turns": 2 * r.calls,
        "metrics": {},
        "extra_fields": {"uid": r.group_id, "session_id": r.session_id, "trace_id": r.trace_id,
                         "advantage": r.advantage},
    }


def to_verl(batch: Any, output_cls: Any = None, **options: Any) -> list[Any]:
    """The batch's trainable traces, groups of fewer than two sessions left out, as `output_cls` instances
    (verl's AgentLoopOutput) or, without one, their keyword arguments. `options`: rows.rollouts'."""
    out = [agent_loop_output(r) for r in trained_rollouts(batch, **options)]
    return out if output_cls is None else [output_cls(**o) for o in out]
