"""verl, Miles and prime-rl adapters on a sealed batch of real harness sessions (fixtures.bridge_batches: the
recorded multi-call captures), checked field by field against the capture records: the response's mask 1 on
exactly the sampled tokens of each call, 0 on the tool results and harness text between them; the logprobs
the engine's; a session the reader leaves out absent, the others' advantages those of their group without it;
a group left with one session absent. The field lists are the projects' own, pinned to a commit; verl's
`AgentLoopOutput` (verl 0.9.1) and Miles' `Sample` (the released miles-rl 0.0.2) are built by the adapters
themselves in the venv hack/setup.d/48-trainer-types.sh installs (their pins are not the project's), from the
same sealed batch; prime-rl is not on the package index, so its adapter's fields are checked against the pinned
list."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tracefleet.trainer.bridges import miles, prime_rl, verl
from tracefleet.trainer.bridges.rows import groups

from fixtures.bridge_batches import TRAINED, close, expected_advantages, expected_response, harness_of, sealed_batch

TYPES_VENV = Path(os.environ.get("TRACEFLEET_CACHE", Path.home() / ".cache" / "tracefleet")) / "trainer-types" / "venv"


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


# Run in the trainer-types venv (hack/setup.d/48-trainer-types.sh) on the sealed batch: the adapters build each
# project's own class; every field comes back as JSON.
REAL_CLASSES = """
import dataclasses, json, sys
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from miles.utils.types import Sample
from tracefleet.traces import BatchReader
from tracefleet.trainer.bridges import miles, verl

batch = BatchReader(sys.argv[1], sys.argv[2]).read(0)
outputs = verl.to_verl(batch, AgentLoopOutput)
samples = miles.to_miles(batch, Sample)
assert all(type(o) is AgentLoopOutput for o in outputs) and all(type(s) is Sample for s in samples)
print(json.dumps({
    "verl": [o.model_dump(mode="json") for o in outputs],
    "miles": [{**dataclasses.asdict(s), "status": s.status.value} for s in samples],
    "miles_fields": [f.name for f in dataclasses.fields(Sample)],
}))
"""


def source_tree(tmp: Path) -> Path:
    """A folder whose `tracefleet` package is this checkout's (the folders the project maps into it, linked), for a
    venv that must not install the project."""
    import tracefleet

    root = tmp / "src"
    package = root / "tracefleet"
    package.mkdir(parents=True)
    for entry in Path(tracefleet.__path__[0]).iterdir():
        (package / entry.name).symlink_to(entry)
    for name in ("traces", "trainer"):
        (package / name).symlink_to(Path(importlib.import_module(f"tracefleet.{name}").__path__[0]))
    return root


@pytest.fixture(scope="module")
def real(batch: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not (TYPES_VENV / ".installed").is_file():
        pytest.fail(f"the trainers' own types are not installed ({TYPES_VENV}): bash hack/setup.d/48-trainer-types.sh",
                    pytrace=False)
    tmp = tmp_path_factory.mktemp("real-classes")
    bucket = sealed_batch(tmp)
    done = subprocess.run([str(TYPES_VENV / "bin" / "python"), "-c", REAL_CLASSES, str(tmp / "bucket"), bucket.manifest.job],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(source_tree(tmp))})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_verl_builds_its_own_agent_loop_outputs(real: dict[str, Any]) -> None:
    advantages = expected_advantages()
    assert [o["extra_fields"]["session_id"] for o in real["verl"]] == TRAINED
    for o in real["verl"]:
        prompt, response, mask, logprobs = expected_response(harness_of(o["extra_fields"]["session_id"]))
        assert o["prompt_ids"] == prompt and o["response_ids"] == response and o["response_mask"] == mask
        assert close(o["response_logprobs"], logprobs) and o["num_turns"] == 6
        assert o["extra_fields"]["advantage"] == pytest.approx(advantages[o["extra_fields"]["session_id"]], abs=1e-6)
    assert [o["reward_score"] for o in real["verl"]] == [1.0, 0.0, 0.5, 0.25, 1.0, 0.0]


def test_miles_builds_its_own_samples(real: dict[str, Any]) -> None:
    samples = real["miles"]
    assert [s["metadata"]["session_id"] for s in samples] == TRAINED
    assert [s["group_index"] for s in samples] == [0, 0, 0, 0, 1, 1] and [s["index"] for s in samples] == list(range(6))
    for s in samples:
        prompt, response, mask, logprobs = expected_response(harness_of(s["metadata"]["session_id"]))
        assert s["tokens"] == prompt + response and s["response_length"] == len(response)
        assert s["loss_mask"] == mask and close(s["rollout_log_probs"], logprobs)
        assert s["status"] == "completed" and s["weight_versions"] == ["0", "0", "0"]
    assert [s["reward"] for s in samples] == [1.0, 0.0, 0.5, 0.25, 1.0, 0.0]
    # the released miles-rl 0.0.2 names the session (`session_id`); the pinned commit counts it (`rollout_id`)
    assert "session_id" in real["miles_fields"] and [s["session_id"] for s in samples] == TRAINED
    if "rollout_id" in real["miles_fields"]:
        assert [s["rollout_id"] for s in samples] == list(range(6))


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
