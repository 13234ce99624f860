"""verl, Miles and prime-rl adapters on a sealed batch of real harness sessions (fixtures.bridge_batches: the
recorded multi-call captures), checked field by field against the capture records: the response's mask 1 on
exactly the sampled tokens of each call, 0 on the tool results and harness text between them; the logprobs
the engine's; a session the reader leaves out absent, the others' advantages those of their group without it;
a group left with one session absent. The field lists are the projects' own, pinned to a commit (none of the
three installs here: GPU-only dependencies)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tracefleet.trainer.bridges import miles, prime_rl, verl
from tracefleet.trainer.bridges.rows import groups

from fixtures.bridge_batches import TRAINED, close, expected_advantages, expected_response, harness_of, sealed_batch


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return sealed_batch(tmp_path_factory.mktemp("bridges"))


def test_groups_are_what_the_reader_trains_on(batch: Any) -> None:
    found = groups(batch)
    assert [[r.session_id for r in g] for g in found] == [["s0", "s1", "s2", "s3"], ["s4", "s5"]]
    advantages = expected_advantages()
    for r in (r for g in found for r in g):
        assert r.advantage == pytest.approx(advantages[r.session_id], abs=1e-6)
        assert r.calls == 3 and r.finish_reason == "stop"  # opencode's auxiliary title call is not trained on


def test_verl_agent_loop_outputs(batch: Any) -> None:
    outputs = verl.to_verl(batch)
    assert [o["extra_fields"]["session_id"] for o in outputs] == TRAINED
    advantages = expected_advantages()
    for o in outputs:
        assert set(o) <= set(verl.FIELDS)
        session = o["extra_fields"]["session_id"]
        prompt, response, mask, logprobs = expected_response(harness_of(session))
        assert o["prompt_ids"] == prompt and o["response_ids"] == response and o["response_mask"] == mask
        assert 0 in mask[: max(i for i, m in enumerate(mask) if m)]  # tool results inside the response
        assert close(o["response_logprobs"], logprobs)
        assert o["num_turns"] == 6 and o["metrics"] == {}
        assert o["extra_fields"]["advantage"] == pytest.approx(advantages[session], abs=1e-6)
    assert {o["extra_fields"]["uid"] for o in outputs} == {"g0", "g1"}


@dataclasses.dataclass
class PinnedSample:
    """Miles' Sample as pinned (miles.PINNED): its fields with their defaults, and its Status enum."""

    import enum

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    tokens: list[int] = dataclasses.field(default_factory=list)
    response_length: int = 0
    reward: float | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = dataclasses.field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    metadata: dict = dataclasses.field(default_factory=dict)


def test_miles_samples(batch: Any) -> None:
    samples = miles.to_miles(batch, PinnedSample)
    assert [s.metadata["session_id"] for s in samples] == TRAINED
    assert [s.group_index for s in samples] == [0, 0, 0, 0, 1, 1] and [s.index for s in samples] == list(range(6))
    assert [s.rollout_id for s in samples] == list(range(6))
    for s in samples:
        assert {f.name for f in dataclasses.fields(s)} <= set(miles.FIELDS)
        prompt, response, mask, logprobs = expected_response(harness_of(s.metadata["session_id"]))
        assert s.tokens == prompt + response and s.response_length == len(response)
        assert s.loss_mask == mask and close(s.rollout_log_probs, logprobs)
        assert s.status is PinnedSample.Status.COMPLETED and s.weight_versions == ["0", "0", "0"]
    assert [s.reward for s in samples] == [1.0, 0.0, 0.5, 0.25, 1.0, 0.0]


def test_prime_rl_training_samples(batch: Any) -> None:
    samples = prime_rl.to_prime_rl(batch, env_name="bridges")
    advantages = expected_advantages()
    assert len(samples) == 6
    for s, session in zip(samples, TRAINED, strict=True):
        assert set(s) <= set(prime_rl.FIELDS)
        prompt, response, mask, logprobs = expected_response(harness_of(session))
        whole_mask = [0] * len(prompt) + mask
        assert s["token_ids"] == prompt + response and s["mask"] == [bool(m) for m in whole_mask]
        assert close(s["logprobs"], [0.0] * len(prompt) + logprobs)
        assert len(s["temperatures"]) == len(s["token_ids"]) and s["env_name"] == "bridges"
        assert close(s["advantages"], [advantages[session] * m for m in whole_mask])
