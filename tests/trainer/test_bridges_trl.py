"""The TRL bridge: real TRL (trl 1.16.0, the `bridges` extra) runs the TRL block of docs/training/trainers.md as
written (its placeholders swapped for the test's: fixtures.doc_snippets), one `GRPOTrainer` step on CPU on the served
SmolLM2, its completions not generated but taken by `TrlRollouts` from the sealed batches of a real
`tracefleet run` against real vLLM (the session's `vllm_server`): the quickstart's agent and task, one GRPO group
of four samples, each scored by how much code it wrote (a reward that differs between samples, so the step has
an advantage to follow). The trained tensors change, the loss is finite, and `PolicySync` puts the step's weights
into vLLM and advances its version label. The server is shared: its weights and label are put back at the end.

Two processes on CPU (torchrun, accelerate's way of starting several; trl_ranks.py is one rank) over a job's two
batches: each step's groups shared out whole between the ranks, each trained once, one vLLM update per step.

Without an engine: `TrlRollouts` on a sealed batch of recorded multi-call sessions (fixtures.bridge_batches):
`env_mask` 0 on the tool results inside a trace, a group short of a sample filled with an unscorable row, a
group left with one session not given to TRL at all, a completion ended by a stop marked as ended, tokens an older
policy sampled masked unless TRL corrects for them."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tracefleet.contract.policy import label_version
from tracefleet.traces import BatchReader
from tracefleet.trainer import EngineControl
from tracefleet.trainer.bridges import trl
from tracefleet.trainer.bridges.rows import Rollout, groups
from tracefleet.trainer.bridges.trl import ADVANTAGE_KEY, REWARD_KEY, SESSION_KEY, TrlRollouts

from fixtures.bridge_batches import JOB as BRIDGES_JOB
from fixtures.bridge_batches import close, expected_advantages, expected_response, harness_of, real_run, sealed_batch
from fixtures.checkpoints import restore_served_weights
from fixtures.doc_snippets import run_snippet, snippet
from fixtures.event_files import scalars
from fixtures.proxy_on_vllm import served_model_dir

JOB = "trl-bridge"
SAMPLES = 4


TESTS = Path(__file__).resolve().parents[1]


@contextmanager
def without_tests_on_path() -> Iterator[None]:
    """sys.path without tests/ (pytest's pythonpath): its folder `vllm` would pass for the vllm package in TRL's
    availability check (version 'N/A', which TRL cannot parse)."""
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != TESTS]
    try:
        yield
    finally:
        sys.path[:] = saved


def rank_logs(log_dir: Path, chars: int = 2500) -> str:
    """The end of each rank's stderr that torchrun wrote under `log_dir` (--redirects 3), progress bars left out."""
    parts = []
    for log in sorted(log_dir.glob("**/attempt_*/*/stderr.log")):
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip() and "it/s]" not in line]
        parts.append(f"--- rank {log.parent.name} stderr ---\n" + "\n".join(lines)[-chars:])
    return "\n".join(parts) + "\n"


def sealed_reader(tmp: Path) -> BatchReader:
    """A BatchReader (with a consumer) over fixtures.bridge_batches' sealed batch."""
    sealed_batch(tmp)
    return BatchReader(tmp / "bucket", BRIDGES_JOB, consumer="trl")


def test_rollouts_are_whole_groups_with_env_mask_and_fillers(tmp_path: Path) -> None:
    rollouts = TrlRollouts(sealed_reader(tmp_path), follow_options={"idle_exit": True})
    trainer = SimpleNamespace(num_generations=4, num_generations_eval=4, model=SimpleNamespace(training=True),
                              eos_token_ids=[2], processing_class=SimpleNamespace(pad_token_id=2))
    out = rollouts(["tracefleet"] * 8, trainer)  # two groups: g0 (four sessions), g1 (two of three kept)
    assert len(out["prompt_ids"]) == 8 and rollouts.blocks_given == 2
    sessions = ["s0", "s1", "s2", "s3", "s4", "s5"]
    advantages = expected_advantages()
    assert out[ADVANTAGE_KEY][:6] == pytest.approx([advantages[s] for s in sessions], abs=1e-6)
    assert out[ADVANTAGE_KEY][6:] == [None, None] and out[REWARD_KEY][6:] == [None, None]  # unscorable fillers
    assert out[REWARD_KEY][:6] == [1.0, 0.0, 0.5, 0.25, 1.0, 0.0]
    for i, session in enumerate(sessions):
        prompt, response, mask, logprobs = expected_response(harness_of(session))
        assert out["prompt_ids"][i] == prompt and out["completion_ids"][i] == response
        assert out["env_mask"][i] == mask and 0 in mask[: max(j for j, m in enumerate(mask) if m)]
        assert close(out["logprobs"][i], logprobs)
    assert all(set(m) == {0} for m in out["env_mask"][6:])
    # a tokenizer whose end is not the traces' last token: each ended on a stop (not its length limit), so it gets
    # the pad id after it, never trained, and TRL does not count it truncated
    other = SimpleNamespace(**{**vars(trainer), "eos_token_ids": [7], "processing_class": SimpleNamespace(pad_token_id=9)})
    again = TrlRollouts(sealed_reader(tmp_path / "again"), follow_options={"idle_exit": True})
    marked = again(["tracefleet"] * 4, other)
    for i, session in enumerate(sessions[:4]):
        assert marked["completion_ids"][i] == [*expected_response(harness_of(session))[1], 9]
        assert marked["env_mask"][i][-1] == 0 and marked["logprobs"][i][-1] == 0.0
    assert rollouts.commit() == [0] and rollouts.reader.cursor() == 1  # every group of the batch given: g2 (one session left) trains nothing
    with pytest.raises(RuntimeError, match="no more sealed batches"):
        rollouts(["tracefleet"] * 4, trainer)


def trace(session: str, advantage: float) -> Rollout:
    return Rollout(tokens=[5, 6, 7, 2], prompt_length=2, loss_mask=[0, 0, 1, 1], logprobs=[0.0, 0.0, -0.5, -0.1],
                   temperatures=[1.0] * 4, reward=advantage, advantage=advantage, group_id="g", session_id=session,
                   trace_id=f"{session}-{advantage}", policy_versions=[0], finish_reason="stop", token_versions=[-1, -1, 0, 0])


def trl_advantages(column: list[float | None], size: int) -> list[float]:
    """TRL's GRPO advantages from a reward column with scale_rewards="none": each block minus its nan-mean."""
    out = []
    for i in range(0, len(column), size):
        block = column[i : i + size]
        scored = [v for v in block if v is not None]
        out += [(v if v is not None else math.nan) - sum(scored) / len(scored) for v in block]
    return out


@pytest.mark.parametrize("sessions", [
    # four sessions, one of whose calls did not chain: five traces, more than num_generations=4
    [("a", 0.75), ("a", 0.75), ("b", -0.25), ("c", -0.25), ("d", -0.25)],
    # three sessions, one with two traces: fits, but its advantages do not sum to 0 over the traces
    [("a", 0.5), ("a", 0.5), ("b", -0.25), ("c", -0.25)],
    [("a", 0.5), ("b", 0.0), ("c", -0.5)],
])
def test_every_trace_gets_its_sessions_advantage_from_trl_however_many_traces_a_group_sealed(
        sessions: list[tuple[str, float]], monkeypatch: pytest.MonkeyPatch) -> None:
    group = [trace(s, a) for s, a in sessions]
    monkeypatch.setattr(trl, "groups", lambda batch, **_: [group])
    reader = SimpleNamespace(job="j", consumer=None, follow=lambda **_: iter([SimpleNamespace(seq=0)]))
    rollouts = TrlRollouts(reader)
    trainer = SimpleNamespace(num_generations=4, num_generations_eval=4, model=SimpleNamespace(training=True),
                              eos_token_ids=[2], processing_class=SimpleNamespace(pad_token_id=2))
    given: dict[str, list[float]] = {}
    while rollouts._groups or rollouts._cut or not given:
        out = rollouts(["tracefleet"] * 4, trainer)
        for session, advantage, mask in zip(out[SESSION_KEY], trl_advantages(out[ADVANTAGE_KEY], 4), out["env_mask"]):
            if session is None:
                assert set(mask) == {0}  # a filler or the balancing row: never in the loss
            else:
                given.setdefault(session, []).append(advantage)
    assert sorted((s, pytest.approx(a)) for s, advantages in given.items() for a in advantages) == sorted(sessions)
    assert rollouts.commit() == [0]  # the batch is committed once its one group was handed out whole


def test_tokens_an_older_policy_sampled_are_masked_unless_trl_corrects_for_them(tmp_path: Path) -> None:
    reader = sealed_reader(tmp_path)
    newest = max(span["policy_version"] for s in reader.read(0).table.column("spans").to_pylist() for span in s)

    def env_masks(**trainer_options: Any) -> list[list[int]]:
        trainer = SimpleNamespace(num_generations=4, num_generations_eval=4, model=SimpleNamespace(training=True),
                                  eos_token_ids=[2], processing_class=SimpleNamespace(pad_token_id=2), **trainer_options)
        rollouts = TrlRollouts(BatchReader(reader.bucket, BRIDGES_JOB), follow_options={"idle_exit": True})
        rollouts.policy_version = newest + 1  # the weights moved on since these calls were sampled
        return rollouts(["tracefleet"] * 4, trainer)["env_mask"]

    assert all(set(m) == {0} for m in env_masks())  # TRL would train them as the current policy's: masked
    assert all(1 in m for m in env_masks(off_policy_mask_threshold=0.5))  # TRL weighs them by the engine's logprobs


def test_the_docs_trl_snippet_trains_a_real_runs_batch_and_updates_vllm(vllm_server: Any, tmp_path: Path) -> None:
    """docs/training/trainers.md's TRL block, as written but for its placeholders: one GRPOTrainer step."""
    import torch

    from tracefleet.dashboard.trackers import TENSORBOARD_DIR
    from tracefleet.trainer.grpo import load_policy

    out = real_run(vllm_server.url, tmp_path, JOB, samples=SAMPLES, turns=2, max_tokens=48, temperature=0.8)
    assert BatchReader(out, JOB).seqs()
    model_dir = Path(served_model_dir(vllm_server.url))
    engine = EngineControl(vllm_server.url)
    start = label_version(engine.label()) or 0
    code = snippet("training/trainers.md", 0, {
        '"s3://bucket/rollouts"': repr(str(out)), '"my-job"': repr(JOB), '{"poll_s": 5}': '{"idle_exit": True}',
        '"trl-out"': repr(str(tmp_path / "trl")), "max_steps=100": "max_steps=1, logging_steps=1", "steps=100": "steps=1",
        'report_to="none")': 'report_to="none", use_cpu=True, bf16=False)',
        '"http://vllm:8000"': repr(vllm_server.url), '"/ckpt"': repr(str(tmp_path / "ckpt")),
        '"trl-run"': repr(str(tmp_path / "run"))})
    try:
        with without_tests_on_path():
            ran = run_snippet(code, model_dir=model_dir)
        trainer, sync, reader = ran["trainer"], ran["sync"], ran["reader"]
        logged = next(h for h in trainer.state.log_history if "loss" in h)
        print(f"\nTRL step: {logged}; policy update {sync.reports[0].seconds:.2f} s")
        assert math.isfinite(logged["loss"])
        # only calls cut at their length limit read as truncated, not those that ended on a stop string or tool call
        cut = [r["spans"][-1]["finish_reason"] == "length" for r in BatchReader(out, JOB).read(0).table.to_pylist()]
        assert logged["completions/clipped_ratio"] == pytest.approx(sum(cut) / len(cut)), (logged, cut)
        before = load_policy(model_dir, train_layers=2)
        trained = dict(before.named_parameters())
        changed = [n for n, p in ran["model"].named_parameters() if p.requires_grad and not torch.equal(p, trained[n])]
        assert changed, "the step changed no trained tensor"
        # the engine's version went on from its own label, not back to 1
        assert label_version(engine.label()) == start + 1 and len(sync.reports) == 1
        # committed once its only group was trained on whole: one step unless a session sealed two traces and the
        # group took two blocks (the second waits for the next step)
        cut = [len(trl.blocks(g, 4)) for g in groups(BatchReader(out, JOB).read(0), max_lag=1)]
        assert reader.cursor() == (1 if cut == [1] else 0), cut
        sync.logger.close()  # the update's figures at TRL's step, under the dashboard's names
        sync_s = sync.reports[0].loop_figures()["sync_s"]
        assert scalars(tmp_path / "run" / TENSORBOARD_DIR)["loop/sync_s"] == [(1, pytest.approx(sync_s))]
    finally:
        restore_served_weights(engine, model_dir)


def test_two_accelerate_processes_train_each_group_once_whole_with_one_sync_per_step(vllm_server: Any,
                                                                                      tmp_path: Path) -> None:
    """Two accelerate processes on CPU over a job's two batches of two groups (short synthetic sessions):
    each step's two groups go one to each rank, each trained once and whole; the main rank alone syncs vLLM, once per
    step, and moves the cursor."""
    import json
    import subprocess

    from tracefleet.bucket import LocalBucket
    from tracefleet.traces import Sealer, SessionInfo, build_traces
    from tracefleet.traces.synthetic import SyntheticSession

    job, steps = "trl-ranks", 2
    model_dir = Path(served_model_dir(vllm_server.url))
    engine = EngineControl(vllm_server.url)
    start = label_version(engine.label()) or 0
    sealer = Sealer(LocalBucket(tmp_path / "bucket"), job, spool=tmp_path / "spool")
    # each batch sampled by the policy its step trains (the first by the engine's, the second by the first step's
    # update): an older policy's tokens would be masked out of the loss, and the step would train on none
    for step, batch in enumerate(((0, 1), (2, 3))):
        traces = []
        for g in batch:
            for i, reward in enumerate((1.0, 0.0, 0.5, 0.25)):
                with SyntheticSession(tmp_path / f"g{g}-s{i}.jsonl", f"g{g}-s{i}", seed=4 * g + i) as sess:
                    sess.call(sess.tokens(24), n_completion=8, policy_version=start + step)
                info = SessionInfo(job=job, session_id=f"g{g}-s{i}", group_id=f"g{g}", task_id=f"g{g}", reward=reward)
                traces += build_traces(tmp_path / f"g{g}-s{i}.jsonl", session=info).traces
        sealer.seal(traces)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # tests/ holds a folder named vllm
    try:
        done = subprocess.run(
            # torchrun, as `accelerate launch` does for several processes (its own multi-CPU launch needs mpirun):
            # accelerate finds the ranks in the environment, gloo on CPU (GRPOConfig use_cpu)
            # each rank's output in its own file (--redirects 3): a failure names the rank that failed and what it said
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
             "--log-dir", str(tmp_path / "logs"), "--redirects", "3",
             str(Path(__file__).with_name("trl_ranks.py")), str(tmp_path / "bucket"), job, vllm_server.url,
             str(model_dir), str(tmp_path), str(steps)],
            capture_output=True, text=True, timeout=900, env=env)
        assert done.returncode == 0, rank_logs(tmp_path / "logs") + done.stderr[-2000:]
        ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
        # step by step: rank 0 the first group of the step, rank 1 the second; each whole, none twice
        assert [[g["groups"] for g in r["given"]] for r in ranks] == [[["g0"] * 4, ["g2"] * 4], [["g1"] * 4, ["g3"] * 4]]
        for r in ranks:
            for g in r["given"]:
                assert sorted(g["sessions"]) == [f"{g['groups'][0]}-s{i}" for i in range(4)]
                assert g["trained_tokens"] == 4 * 8, g  # every sampled token of the group's four sessions
        assert ranks[0]["syncs"] == [start + 1, start + 2] and ranks[1]["syncs"] == []  # one sync per step
        assert label_version(engine.label()) == start + steps
        assert BatchReader(tmp_path / "bucket", job, consumer="trl").cursor() == 2
    finally:
        restore_served_weights(engine, model_dir)
