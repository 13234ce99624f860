"""The TRL bridge: real TRL (trl 1.16.0, the `bridges` extra) runs the TRL block of docs/training/trainers.md as
written (its placeholders swapped for the test's: fixtures.doc_snippets), one `GRPOTrainer` step on CPU on the served
SmolLM2, its completions not generated but taken by `TrlRollouts` from the sealed batches of a real
`tracefleet run` against real vLLM (the session's `vllm_server`): the quickstart's agent and task, one GRPO group
of four samples, each scored by how much code it wrote (a reward that differs between samples, so the step has
an advantage to follow). The trained tensors change, the loss is finite, and `PolicySync` puts the step's weights
into vLLM and advances its version label. The server is shared: its weights and label are put back at the end.

Without an engine: `TrlRollouts` on a sealed batch of recorded multi-call sessions (fixtures.bridge_batches):
`env_mask` 0 on the tool results inside a trace, a group short of a sample filled with an unscorable row, a
group left with one session not given to TRL at all."""

from __future__ import annotations

import math
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
from tracefleet.trainer.bridges.trl import ADVANTAGE_KEY, REWARD_KEY, TrlRollouts

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


class Reader:
    """A BatchReader stand-in over one batch already read (what TrlRollouts needs of it)."""

    def __init__(self, batch: Any) -> None:
        self.batch, self.job, self.consumer = batch, "bridges", None

    def follow(self, **_: Any) -> Any:
        yield self.batch


def test_rollouts_are_whole_groups_with_env_mask_and_fillers(tmp_path: Path) -> None:
    rollouts = TrlRollouts(Reader(sealed_batch(tmp_path)))
    trainer = SimpleNamespace(num_generations=4, num_generations_eval=4, model=SimpleNamespace(training=True),
                              eos_token_ids=[2], processing_class=SimpleNamespace(pad_token_id=2))
    out = rollouts(["tracefleet"] * 8, trainer)  # two groups: g0 (four sessions), g1 (two of three kept)
    assert len(out["prompt_ids"]) == 8 and rollouts.groups_given == 2
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
    marked = TrlRollouts(Reader(sealed_batch(tmp_path / "again")))(["tracefleet"] * 4, other)
    for i, session in enumerate(sessions[:4]):
        assert marked["completion_ids"][i] == [*expected_response(harness_of(session))[1], 9]
        assert marked["env_mask"][i][-1] == 0 and marked["logprobs"][i][-1] == 0.0
    assert rollouts.commit() == [0]  # every group of the batch given: g2 (one session left) trains nothing
    with pytest.raises(RuntimeError, match="no more sealed batches"):
        rollouts(["tracefleet"] * 4, trainer)


def test_tokens_an_older_policy_sampled_are_masked_unless_trl_corrects_for_them(tmp_path: Path) -> None:
    batch = sealed_batch(tmp_path)
    newest = max(v for s in batch.table.column("spans").to_pylist() for v in (span["policy_version"] for span in s))

    def env_masks(**trainer_options: Any) -> list[list[int]]:
        trainer = SimpleNamespace(num_generations=4, num_generations_eval=4, model=SimpleNamespace(training=True),
                                  eos_token_ids=[2], processing_class=SimpleNamespace(pad_token_id=2), **trainer_options)
        rollouts = TrlRollouts(Reader(batch))
        rollouts.policy_version = newest + 1  # the weights moved on since these calls were sampled
        return rollouts(["tracefleet"] * 4, trainer)["env_mask"]

    assert all(set(m) == {0} for m in env_masks())  # TRL would train them as the current policy's: masked
    assert all(1 in m for m in env_masks(off_policy_mask_threshold=0.5))  # TRL weighs them by the engine's logprobs
    with pytest.raises(RuntimeError, match="runs in one process"):
        env_masks(accelerator=SimpleNamespace(num_processes=2))


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
        assert reader.cursor() == 1  # the batch's only group was trained on: committed
        sync.logger.close()  # the update's figures at TRL's step, under the dashboard's names
        sync_s = sync.reports[0].loop_figures()["sync_s"]
        assert scalars(tmp_path / "run" / TENSORBOARD_DIR)["loop/sync_s"] == [(1, pytest.approx(sync_s))]
    finally:
        restore_served_weights(engine, model_dir)
