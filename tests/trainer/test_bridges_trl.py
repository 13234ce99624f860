"""The TRL bridge: real TRL (trl 1.16.0, the `bridges` extra) runs one `GRPOTrainer` step on CPU on the served
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
    trainer = SimpleNamespace(num_generations=4, num_generations_eval=4, model=SimpleNamespace(training=True))
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
    assert rollouts.commit() == [0]  # every group of the batch given: g2 (one session left) trains nothing
    with pytest.raises(RuntimeError, match="no more sealed batches"):
        rollouts(["tracefleet"] * 4, trainer)


def test_one_grpo_trainer_step_on_a_real_runs_batch_updates_vllm(vllm_server: Any, tmp_path: Path) -> None:
    import torch
    from transformers import AutoTokenizer

    from tracefleet.dashboard.trackers import TENSORBOARD_DIR, StepLogger
    from tracefleet.trainer.bridges.trl import PolicySync, placeholder_dataset, session_advantage
    from tracefleet.trainer.grpo import load_policy

    with without_tests_on_path():
        from trl import GRPOConfig, GRPOTrainer

    out = real_run(vllm_server.url, tmp_path, JOB, samples=SAMPLES, turns=2, max_tokens=48, temperature=0.8)
    reader = BatchReader(out, JOB, consumer="trl")
    assert reader.seqs()

    model_dir = Path(served_model_dir(vllm_server.url))
    engine = EngineControl(vllm_server.url)
    start = label_version(engine.label()) or 0
    model = load_policy(model_dir, train_layers=2)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    rollouts = TrlRollouts(reader, follow_options={"idle_exit": True})
    board = StepLogger(tmp_path / "run")
    sync = PolicySync([vllm_server.url], tmp_path / "ckpt", rollouts, start_version=start, logger=board)
    config = GRPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=SAMPLES,
                        num_generations=SAMPLES, max_steps=1, learning_rate=1e-4, use_cpu=True, bf16=False,
                        report_to="none", logging_steps=1, save_strategy="no", scale_rewards="none", beta=0.0,
                        temperature=0.8, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[session_advantage], args=config,
                          train_dataset=placeholder_dataset(1, 1), processing_class=AutoTokenizer.from_pretrained(model_dir),
                          rollout_func=rollouts, callbacks=[sync])
    try:
        with without_tests_on_path():
            trainer.train()
        logged = next(h for h in trainer.state.log_history if "loss" in h)
        print(f"\nTRL step: {logged}; policy update {sync.reports[0].seconds:.2f} s")
        assert math.isfinite(logged["loss"])
        changed = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
        assert changed, "the step changed no trained tensor"
        assert label_version(engine.label()) == start + 1 and len(sync.reports) == 1
        assert reader.cursor() == 1  # the batch's only group was trained on: committed
        board.close()  # the update's figures at TRL's step, under the dashboard's names
        sync_s = sync.reports[0].loop_figures()["sync_s"]
        assert scalars(tmp_path / "run" / TENSORBOARD_DIR)["loop/sync_s"] == [(1, pytest.approx(sync_s))]
    finally:
        restore_served_weights(engine, model_dir)
