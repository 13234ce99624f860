"""The recipe's levers as `tracefleet train` options, before anything starts: the group size reaches the job the
rollouts run, the combinations that make no sense (or that would train on what the policy did not sample) are
refused in one line with exit 2, the loop refuses a batch with a trainable token no policy version sampled, Dr.
GRPO's advantages are centred and not divided by the std, `positive` keeps only the advantages above 0 (the
rows below their group's mean out of the step), and scored sets give their standard errors and paired
gains. (`--flat-groups drop`'s loss: tests/trainer/test_signal_rows.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracefleet.api.manifest import load_job
from tracefleet.cli import main as cli_main
from tracefleet.traces.advantages import group_advantages
from tracefleet.trainer.loop import (LoopOptions, machine_threads, positive_advantages, repeated_job, step_threads,
                                     unsampled_trained_tokens, with_signal)
from tracefleet.trainer.scores import SetScores, line, paired_gain

from fixtures.scripts import script_module

REPO = Path(__file__).resolve().parents[2]
HARNESS_JOB = REPO / "examples" / "harness-train" / "job.yaml"


def test_the_group_size_reaches_the_rollouts_job() -> None:
    job = load_job(HARNESS_JOB)
    looped = repeated_job(job, HARNESS_JOB.parent, rounds=2, traces_per_step=8, group_size=2)
    assert looped.spec.tasks.samples_per_task == 2 and looped.spec.output.traces_per_batch == 8
    assert repeated_job(job, HARNESS_JOB.parent, rounds=1, traces_per_step=None).spec.tasks.samples_per_task == 4


def test_the_options_refuse_what_they_cannot_mean_in_one_line(capsys: Any) -> None:
    job = str(HARNESS_JOB)
    cases = [
        (["--group-size", "1"], "--group-size must be 2 or more: a group of one session has no reward spread"),
        (["--explore", "0.3"], "--explore applies to --task-sampling spread only"),
        (["--task-sampling", "spread", "--explore", "2"], "--explore must be between 0 and 1"),
        (["--train-flat", "--flat-groups", "drop"], "--flat-groups drop leaves such groups out: choose one"),
        (["--task-sampling", "often"], "invalid choice: 'often'"),
        (["--advantage", "ppo"], "invalid choice: 'ppo'"),
        (["--kl", "-0.1"], "--kl must be 0 (no penalty) or more"),
        (["--target-kl", "-0.01"], "--target-kl must be 0 (the learning rate fixed) or more"),
        (["--demo-mix", "-1"], "--demo-mix must be 0 (none) or more"),
        (["--demo-mix", "1"], "--demo-mix mixes the warm start's demonstrations into GRPO's steps: give --demos"),
        (["--guide", "-0.2"], "--guide must be 0 (no guide) or a pass rate up to 1"),
        (["--guide", "1.5"], "--guide must be a pass rate in (0, 1]"),
        (["--demos", "4", "--warm-layers", "-1"], "--warm-layers must be 0 (every layer) or more"),
        (["--warm-layers", "8"], "--warm-layers applies to a warm start: give --demos or --warm-start"),
        (["--warm-schedule", "linear"], "--warm-schedule applies to a warm start: give --demos or --warm-start"),
        (["--demos", "4", "--warm-schedule", "cosine"], "invalid choice: 'cosine'"),
        (["--schedule", "sometimes"], "invalid choice: 'sometimes'"),
    ]
    for extra, message in cases:
        capsys.readouterr()
        argv = ["train", job, *extra]
        try:
            assert cli_main(argv) == 2, argv
        except SystemExit as exc:  # argparse's own usage errors
            assert exc.code == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)
        assert err.count("\n") == 1 or err.startswith("usage:"), err


def test_the_trainer_takes_every_core_only_when_the_rollouts_are_paused() -> None:
    """Beside the rollouts (`overlap`) the trainer keeps to one thread, vLLM's CPU build holding the other cores; with
    the engine paused for each step (`alternate`) it takes every core; `--torch-threads` overrides both."""
    assert step_threads(LoopOptions(job_path=HARNESS_JOB)) == 1
    assert step_threads(LoopOptions(job_path=HARNESS_JOB, schedule="alternate")) == machine_threads() >= 1
    assert step_threads(LoopOptions(job_path=HARNESS_JOB, schedule="alternate", torch_threads=3)) == 3


def test_the_loop_refuses_a_trainable_token_no_policy_sampled() -> None:
    torch = pytest.importorskip("torch")
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    versions = torch.tensor([[-1, 3, 3, -1], [-1, -1, 2, 2]])
    assert unsampled_trained_tokens({"loss_mask": mask, "token_versions": versions}) == 0
    # a token in the loss that the engine did not sample for the policy (a prefix given as context would be one)
    versions[1, 3] = -1
    assert unsampled_trained_tokens({"loss_mask": mask, "token_versions": versions}) == 1


def test_dr_grpo_advantages_are_centred_not_scaled() -> None:
    rewards, groups = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0], ["a", "a", "a", "a", "b", "b"]
    grpo = group_advantages(rewards, groups)
    dr = group_advantages(rewards, groups, normalize_std=False)
    np.testing.assert_allclose(dr, [0.75, -0.25, -0.25, -0.25, 0.0, 0.0])
    np.testing.assert_allclose(grpo[:4], dr[:4] / np.std([1.0, 0.0, 0.0, 0.0]), rtol=1e-5)


def test_positive_advantages_reinforce_only_the_sessions_above_their_groups_mean() -> None:
    import torch

    rewards, groups = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0], ["a", "a", "a", "a", "b", "b"]
    seq = torch.tensor(group_advantages(rewards, groups), dtype=torch.float32)
    mask = torch.tensor([[0, 1, 1]] * 6, dtype=torch.float32)
    t = {"input_ids": torch.arange(18).reshape(6, 3), "attention_mask": torch.ones(6, 3), "loss_mask": mask,
         "sequence_advantages": seq, "advantages": seq[:, None] * mask}
    p = positive_advantages(t)
    assert p["sequence_advantages"].tolist() == pytest.approx([float(seq[0]), 0, 0, 0, 0, 0])
    assert bool((p["advantages"] >= 0).all()) and torch.equal(p["advantages"][0], t["advantages"][0])
    assert t["sequence_advantages"].tolist() == seq.tolist()  # the batch's own tensors untouched
    kept = with_signal(p)
    assert kept is not None and kept["input_ids"].tolist() == [[0, 1, 2]]  # the rows below the mean: no pass


def test_scores_give_standard_errors_and_paired_gains() -> None:
    assert paired_gain({"a#0": 0.0, "b#0": 1.0, "c#0": 0.0}, {"a#0": 1.0, "b#0": 1.0, "c#0": 1.0, "d#0": 0.0}) == \
        pytest.approx((2 / 3, (1 / 3) ** 0.5 / 3 ** 0.5, 3))

    def results(rewards: dict[str, float]) -> list[Any]:
        from types import SimpleNamespace

        return [SimpleNamespace(task_id=k, sample_index=0, reward=v, task_metadata={"kind": k[0]})
                for k, v in rewards.items()]

    s = SetScores(name="held", path="held.yaml")
    s.add("warm", results({"x1": 0.0, "x2": 1.0, "y1": 0.0, "y2": 0.0}))
    s.add("after", results({"x1": 1.0, "x2": 1.0, "y1": 0.0, "y2": 1.0}))
    mean, se, n = s.point("after")
    assert (mean, n) == (0.75, 4) and se == pytest.approx(0.25)
    assert s.gain("warm", "after") == pytest.approx((0.5, 0.2886751, 4))
    assert s.by_kind("after") == {"x": (2, 2), "y": (1, 2)}
    summary = s.summary()
    assert summary["gains"]["warm->after"]["n"] == 4 and "before" not in summary["points"]
    assert line(s.point("after")) == "0.75 ±0.25" and line(s.gain("warm", "after"), signed=True) == "+0.50 ±0.29"
    assert line((None, None, 0)) == "-"


def test_the_bench_prints_both_sets_per_seed_and_the_mean_of_the_seeds(capsys: Any) -> None:
    from types import SimpleNamespace

    from tracefleet.trainer.loop import LoopResult

    bench = script_module(REPO / "bench" / "harness_loop.py", "harness_loop")

    def scored(name: str, rewards: dict[str, list[float]]) -> SetScores:
        s = SetScores(name=name, path=f"{name}.yaml")
        for checkpoint, values in rewards.items():
            s.add(checkpoint, [SimpleNamespace(task_id=f"t{i}", sample_index=0, reward=v, task_metadata={"kind": "k"})
                               for i, v in enumerate(values)])
        return s

    rows = []
    for seed in (0, 1, 2):
        r = LoopResult(run_dir=Path("/tmp"), wall_s=3000.0, startup_s=120.0,
                       phase_s={"score_held_out_before": 180.0, "score_train_before": 60.0})
        r.scores = {"held": scored("held", {"before": [0, 0, 0, 0], "warm": [0, 1, 0, 0], "after": [1, 1, 0, seed % 2]}),
                    "novel": scored("novel", {"before": [0, 0], "warm": [0, 0], "after": [1, 0]})}
        r.flat = [{}] * 3
        rows.append(bench.seed_row(seed, r))
    assert rows[0]["recipe_min"] == 44.0  # 3000 s less the start and the policy-0 scoring
    bench.print_sets(rows)
    out = capsys.readouterr().out
    assert "held: base / warm start / RL" in out and "novel: base / warm start / RL" in out
    assert "   0         4  0.00 ±0.00    0.25 ±0.25    0.50 ±0.29    +0.25 ±0.25" in out, out
    assert "mean of 3 seeds: 0.00 ±0.00 / 0.25 ±0.00 / 0.58 ±0.08; RL over the warm start +0.33 ±0.14 paired over 12" in out, out
    assert "by kind, every seed's sessions (solved/sessions at base / warm start / RL): k 0/12 / 3/12 / 7/12" in out, out

    # a seed run with --skip-base-score (policy 0 unscored) beside them: its base is "-", the base mean over the rest
    r = LoopResult(run_dir=Path("/tmp"), wall_s=3000.0, startup_s=120.0)
    r.scores = {"held": scored("held", {"warm": [1, 1, 0, 0], "after": [1, 1, 1, 0]})}
    late = bench.seed_row(3, r)
    assert late["recipe_min"] == 48.0 and late["held_out"][0] is None
    bench.print_sets([*rows, late])
    out = capsys.readouterr().out
    assert "   3         4  -             0.50 ±0.29    0.75 ±0.25    +0.25 ±0.25" in out, out
    assert "mean of 4 seeds: 0.00 ±0.00 / 0.31 ±0.06 / 0.62 ±0.07" in out, out
