"""The form every bridge converts from: one `Rollout` per trace a trainer trains on, in the reader's row order.

A trace is one causal token stream (tracefleet.traces.schema): the first call's prompt, then every sampled span
with the context between them (tool results, the harness's own text) that the policy did not sample. Split at
the first sampled token it is the prompt / response pair the trainers' types take, the response's mask 1 on the
sampled tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# a group's statistics need two sessions: one alone has nothing to be compared with (advantage 0)
MIN_GROUP_SESSIONS = 2


@dataclass(frozen=True)
class Rollout:
    tokens: list[int]  # the whole trace
    prompt_length: int  # the tokens before the first sampled one (the first call's prompt)
    loss_mask: list[int]  # 1 where the policy sampled the token
    logprobs: list[float]  # the behaviour logprob of each sampled token, 0.0 elsewhere
    temperatures: list[float]  # the temperature each token was sampled at (1.0 on context)
    reward: float
    advantage: float  # the group advantage of the trace's session (tracefleet.contract.semantics)
    group_id: str | None
    session_id: str
    trace_id: str
    policy_versions: list[int]  # the version that sampled each span
    finish_reason: str | None  # the last call's
    token_versions: list[int]  # the version that sampled each token, -1 on context (tracefleet.traces.versions)

    @property
    def prompt_ids(self) -> list[int]:
        return self.tokens[: self.prompt_length]

    @property
    def response_ids(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    @property
    def response_mask(self) -> list[int]:
        return self.loss_mask[self.prompt_length :]

    @property
    def response_logprobs(self) -> list[float]:
        return self.logprobs[self.prompt_length :]

    def response_mask_from(self, version: int | None) -> list[int]:
        """`response_mask` without the tokens a version older than `version` sampled (all of it for None)."""
        if version is None:
            return self.response_mask
        versions = self.token_versions[self.prompt_length :]
        return [m if v >= version else 0 for m, v in zip(self.response_mask, versions, strict=True)]

    @property
    def calls(self) -> int:
        return len(self.policy_versions)


def rollouts(batch: Any, *, include_auxiliary: bool = False, include_quarantined: bool = False,
             include_infrastructure: bool = False, **tensor_options: Any) -> list[Rollout]:
    """The rows of `batch.table` a trainer trains on (`trained` in `Batch.tensors()`: auxiliary, quarantined and
    infrastructure-failed rows left out unless asked for, as the reader does) as Rollouts, in the table's order,
    each with its session id; `tensor_options` are `Batch.tensors()`'s (max_lag, leave_one_out, temperature,
    allow_raw_logprobs, stale...)."""
    t = batch.tensors(include_auxiliary=include_auxiliary, include_quarantined=include_quarantined,
                      include_infrastructure=include_infrastructure, **tensor_options)
    columns = batch.table.select(["group_id", "session_id", "trace_id", "spans"]).to_pylist()
    out = []
    for i, (row, trained) in enumerate(zip(columns, t["trained"].tolist(), strict=True)):
        if not trained:
            continue
        n = int(t["attention_mask"][i].sum())
        spans = row["spans"] or []
        out.append(Rollout(
            tokens=t["input_ids"][i, :n].tolist(),
            prompt_length=spans[0]["completion_start"] if spans else n,
            loss_mask=[int(v) for v in t["loss_mask"][i, :n].tolist()],
            logprobs=t["old_logprobs"][i, :n].tolist(),
            temperatures=t["temperatures"][i, :n].tolist(),
            reward=float(t["rewards"][i]),
            advantage=float(t["sequence_advantages"][i]),
            group_id=row["group_id"], session_id=row["session_id"], trace_id=row["trace_id"],
            policy_versions=[s["policy_version"] for s in spans],
            finish_reason=spans[-1]["finish_reason"] if spans else None,
            token_versions=t["token_versions"][i, :n].tolist(),
        ))
    return out


def groups(batch: Any, **options: Any) -> list[list[Rollout]]:
    """`rollouts(batch)` by GRPO group, in first-seen order, leaving out every group with fewer than two sessions
    (and traces without a group): they train nothing."""
    by_group: dict[str, list[Rollout]] = {}
    for r in rollouts(batch, **options):
        if r.group_id is not None:
            by_group.setdefault(r.group_id, []).append(r)
    return [rows for rows in by_group.values() if len({r.session_id for r in rows}) >= MIN_GROUP_SESSIONS]


def trained_rollouts(batch: Any, **options: Any) -> list[Rollout]:
    """`groups(batch)` one after the other: the rows every bridge converts, one output per Rollout in this order
    (a type without room for the session id, as Tinker's Datum and prime-rl's TrainingSample, is matched to its
    row by position in this list)."""
    return [r for group in groups(batch, **options) for r in group]
