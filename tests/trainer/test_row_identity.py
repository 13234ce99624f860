"""One row identity in every view of a batch (traces/reader.py): a sealed batch of real harness sessions (the
recorded multi-call captures) holding rows the infrastructure failed, rows the policy failed, ok rows, an
auxiliary title call and a quarantined session, read through every view a trainer has (`table`, `traces()`,
`advantages()`, `tensors()`, `training_table()`) and every bridge (rows, verl, Miles, prime-rl, Tinker, TRL): row
by row, each names the session the table names at that place (or carries its id) and gives it the advantage of its
group without the rows left out of training."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tracefleet.bucket import open_bucket
from tracefleet.contract.semantics import OutcomeKind
from tracefleet.traces import BatchReader, SessionInfo, build_traces
from tracefleet.traces.advantages import group_advantages
from tracefleet.traces.reader import take_rows
from tracefleet.traces.seal import seal_traces
from tracefleet.trainer.bridges import miles, prime_rl, tinker, verl
from tracefleet.trainer.bridges.rows import rollouts, trained_rollouts
from tracefleet.trainer.bridges.trl import ADVANTAGE_KEY, SESSION_KEY, TrlRollouts

from fixtures.bridge_batches import DATA

JOB = "rows"
OK, POLICY, INFRA = OutcomeKind.OK, OutcomeKind.POLICY, OutcomeKind.INFRASTRUCTURE
# group -> [(session, harness, reward, how it ends)]: "infra" (its evaluator could not run), "policy" (the harness
# timed out after the model answered), "quarantined" (a diagnostic's verdict), else ok; opencode adds an auxiliary
# title call. g1 is left with one valid session: advantage 0, no bridge gets it.
SESSIONS = {
    "g0": [("s0", "infra", "codex", 0.0), ("s1", "ok", "claude-code", 1.0), ("s2", "policy", "opencode", 0.0),
           ("s3", "ok", "qwen-code", 0.5), ("s4", "quarantined", "pi", 0.0)],
    "g1": [("s5", "ok", "gemini-cli", 1.0), ("s6", "infra", "pi", 0.0)],
    "g2": [("s7", "policy", "codex", -1.0), ("s8", "ok", "opencode", 1.0)],
}
LEFT_OUT = {"infra", "quarantined"}


def expected_advantages() -> dict[str, float]:
    """Each trained session's advantage by hand: its group's statistics over the sessions not left out."""
    out: dict[str, float] = {}
    for group, rows in SESSIONS.items():
        kept = [(s, r) for s, end, _, r in rows if end not in LEFT_OUT]
        adv = group_advantages([r for _, r in kept], [group] * len(kept), [s for s, _ in kept])
        out.update({s: float(a) for (s, _), a in zip(kept, adv, strict=True)})
    return out


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> BatchReader:
    tmp = tmp_path_factory.mktemp("rows")
    traces = []
    for group, rows in SESSIONS.items():
        for session, end, harness, reward in rows:
            info = SessionInfo(job=JOB, session_id=session, group_id=group, task_id=group, reward=reward,
                               evaluator_status="unavailable" if end == "infra" else "ok",
                               failure="session_timeout:harness" if end == "policy" else None)
            for t in build_traces(DATA / f"recorded-{harness}.jsonl", session=info).traces:
                t.meta.quarantined = end == "quarantined"
                traces.append(t)
    bucket = open_bucket(str(tmp / "bucket"))
    seal_traces(bucket, JOB, traces)
    return BatchReader(bucket, JOB)


def test_every_view_and_every_bridge_names_the_same_session_with_the_same_advantage(reader: BatchReader) -> None:
    batch = reader.read(0)
    table = batch.table.to_pylist()
    sessions = [r["session_id"] for r in table]
    kinds = {r["session_id"]: r["outcome_kind"] for r in table}
    assert {kinds["s0"], kinds["s6"]} == {INFRA} and {kinds["s2"], kinds["s7"]} == {POLICY} and kinds["s1"] == OK
    assert [r["new_root_reason"] for r in table].count("auxiliary") == 2  # opencode's title calls
    expected = expected_advantages()
    trained = [r["session_id"] in expected and r["new_root_reason"] != "auxiliary" for r in table]
    want = [expected[s] if k else 0.0 for s, k in zip(sessions, trained, strict=True)]

    # the per-row views: every row of the table, in its order
    assert [t.meta.session_id for t in batch.traces()] == sessions
    assert batch.trained() == trained
    assert batch.advantages().tolist() == pytest.approx(want, abs=1e-6)
    t = batch.tensors()
    assert t["trained"].tolist() == trained
    assert t["sequence_advantages"].tolist() == pytest.approx(want, abs=1e-6)
    for i, row in enumerate(table):
        n = len(row["tokens"])
        assert t["input_ids"][i, :n].tolist() == row["tokens"] and int(t["attention_mask"][i].sum()) == n
        assert t["rewards"][i].item() == pytest.approx(row["reward"])
        if not trained[i]:  # there, but nothing of it reaches the loss
            assert not t["loss_mask"][i].any() and not t["advantages"][i].any()
        else:
            assert t["loss_mask"][i, :n].tolist() == [float(m) for m in row["loss_mask"]]
            on = t["advantages"][i][t["loss_mask"][i] > 0].tolist()
            assert on == pytest.approx([want[i]] * len(on), abs=1e-6)

    # the subsets carry their session ids: the trained rows in the table's order
    kept = [s for s, k in zip(sessions, trained, strict=True) if k]
    assert batch.training_table().column("session_id").to_pylist() == kept
    only = take_rows(t, t["trained"])
    assert only["sequence_advantages"].tolist() == pytest.approx([expected[s] for s in kept], abs=1e-6)
    tokens = {(r["session_id"], r["trace_id"]): r["tokens"] for r in table}

    # the bridges: the trained rows of groups with two valid sessions, each with its session's advantage
    found = trained_rollouts(batch)
    assert [r.session_id for r in found] == [s for s in kept if s not in ("s5",)]  # g1 keeps one session
    assert [r.session_id for r in rollouts(batch)] == kept
    for r in found:
        assert r.advantage == pytest.approx(expected[r.session_id], abs=1e-6)
        assert r.tokens == tokens[(r.session_id, r.trace_id)]
    outputs = verl.to_verl(batch)
    assert [o["extra_fields"]["session_id"] for o in outputs] == [r.session_id for r in found]
    assert [o["extra_fields"]["advantage"] for o in outputs] == pytest.approx([r.advantage for r in found])
    samples = miles.to_miles(batch)
    assert [s["metadata"]["session_id"] for s in samples] == [r.session_id for r in found]
    assert [s["metadata"]["advantage"] for s in samples] == pytest.approx([r.advantage for r in found])
    # no room for an id: matched by position to trained_rollouts, so their tokens and advantages must be its
    for sample, r in zip(prime_rl.to_prime_rl(batch), found, strict=True):
        assert sample["token_ids"] == r.tokens
        on = [a for a, m in zip(sample["advantages"], sample["mask"], strict=True) if m]
        assert on and on == pytest.approx([r.advantage] * len(on))
    for datum, r in zip(tinker.datums(batch), found, strict=True):
        assert datum.loss_fn_inputs["target_tokens"].data == r.tokens[1:]
        on = [a for a, m in zip(datum.loss_fn_inputs["advantages"].data, r.loss_mask[1:], strict=True) if m]
        assert on and on == pytest.approx([r.advantage] * len(on))
    trainer = SimpleNamespace(num_generations=4, num_generations_eval=4, model=SimpleNamespace(training=True),
                              eos_token_ids=[2], processing_class=SimpleNamespace(pad_token_id=2))
    given = TrlRollouts(reader)(["p"] * 8, trainer)  # g0 and g2, in the table's order, fillers None
    ids = [s for s in given[SESSION_KEY] if s is not None]
    assert ids == [r.session_id for r in found]
    assert [a for a in given[ADVANTAGE_KEY] if a is not None] == pytest.approx([expected[s] for s in ids])


def test_stale_rows_dropped_stay_in_place_untrained(reader: BatchReader) -> None:
    batch = reader.read(0)
    t = batch.tensors(min_policy_version=1, stale="drop")  # every recorded token is version 0: all stale
    assert t["input_ids"].shape[0] == batch.table.num_rows and not t["trained"].any()
    assert not t["sequence_advantages"].any() and not t["loss_mask"].any()
    assert rollouts(batch, min_policy_version=1, stale="drop") == []
