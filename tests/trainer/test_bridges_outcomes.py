"""Every bridge leaves a session the infrastructure failed out, as BatchReader does (tracefleet.contract.semantics,
OutcomeKind): a group of three whose evaluator could not run for one sample reaches verl, Miles, prime-rl, Tinker
and TRL's rows as the group of the other two, with that group's advantages; a group left with one valid sample
reaches none of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracefleet.bucket import LocalBucket
from tracefleet.runner.tracing import SessionOutcome, session_traces
from tracefleet.trainer.bridges import miles, prime_rl, tinker, verl
from tracefleet.trainer.bridges.rows import groups
from tracefleet.traces.advantages import group_advantages
from tracefleet.traces.reader import BatchReader
from tracefleet.traces.seal import Sealer
from tracefleet.traces.synthetic import SyntheticSession


def _session(tmp_path: Path, task: str, sample: int, reward: float, evaluator: str = "ok") -> list:
    sid = f"j-{task}-s{sample}"
    path = tmp_path / f"{sid}.jsonl"
    with SyntheticSession(path, sid, seed=sample) as sess:
        sess.call(sess.tokens(30), n_completion=8)
    outcome = SessionOutcome(job="j", session_id=sid, task_id=task, group_id=f"j/{task}", sample_index=sample,
                             reward=reward, evaluator_status=evaluator, status="completed")
    return session_traces(path, outcome).traces


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("bridge-outcomes")
    rows = (_session(tmp, "a", 0, 0.0, evaluator="unavailable")  # its evaluator could not run
            + _session(tmp, "a", 1, 1.0) + _session(tmp, "a", 2, 0.0)
            + _session(tmp, "b", 0, 0.0, evaluator="unavailable") + _session(tmp, "b", 1, 1.0))
    bucket = LocalBucket(tmp / "bucket")
    Sealer(bucket, "j", spool=tmp / "spool").seal(rows)
    return BatchReader(bucket, "j").read(0)


def test_every_bridge_leaves_the_infrastructures_sample_out(batch) -> None:
    without = group_advantages([1.0, 0.0], ["j/a"] * 2, ["j-a-s1", "j-a-s2"]).tolist()
    found = groups(batch)
    assert [[r.session_id for r in g] for g in found] == [["j-a-s1", "j-a-s2"]]  # group b: one valid sample
    assert [r.advantage for r in found[0]] == pytest.approx(without)
    assert len(verl.to_verl(batch)) == len(miles.to_miles(batch)) == len(prime_rl.to_prime_rl(batch)) == 2
    assert [d["reward_score"] for d in verl.to_verl(batch)] == [1.0, 0.0]
    assert [s["advantages"][-1] for s in prime_rl.to_prime_rl(batch)] == pytest.approx(without)
    assert len(tinker.datums(batch)) == 2
    # asked for, the sample is back and moves its group's baseline
    everything = groups(batch, include_infrastructure=True)
    assert [len(g) for g in everything] == [3, 2]
    assert everything[0][1].advantage != pytest.approx(without[0])
