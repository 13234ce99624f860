"""Training through a real harness, token for token: a real Pi session whose completions real vLLM sampled, with
two tool rounds that a warm-started checkpoint supplies, sealed into a trace whose loss mask covers exactly the
tokens the engine sampled (Pi's system prompt, the user's task, the tool results and the template's own tokens
masked), and the trainer's logprob of every trainable token equal to the engine's within the loop's tolerance.

The checkpoint is made here, small and fast: one demonstration of a two-round task (read, then edit) recorded
through Pi against the scripted engine in exact mode (tracefleet.trainer.demos), and the reference trainer's
supervised warm start (tracefleet.trainer.grpo.sft) run on its sampled tokens until the policy repeats it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tracefleet.runner.local import LocalOptions, LocalRun
from tracefleet.traces import BatchReader
from tracefleet.trainer import demos, filetasks
from tracefleet.trainer.control import EngineControl, update_policy
from tracefleet.trainer.loop import job_tasks, served_model_dir, with_tasks

from fixtures.checkpoints import restore_served_weights
from fixtures.harness_traces import session_records, trace_problems

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "harness-train" / "job.yaml"
# the loop's tolerance for trainer vs engine logprobs (tests/vllm/test_vllm_policy_update.py: measured 3.2e-5)
LOGPROB_TOLERANCE = 1e-3
WARM_EPOCHS = 12  # measured: NLL per token 1.23 -> 0.0008 on the one demonstration
WARM_LR = 1e-3


def one_task_job(tmp_path: Path) -> tuple[Path, filetasks.FileTask]:
    """The example job holding one two-round task (change one line: read, then edit) as its only task."""
    task = next(t for t in filetasks.load_tasks(JOB.parent / filetasks.TRAIN_FILE) if t.kind == "fix")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(task.spec()) + "\n")
    job = tmp_path / "job.yaml"
    job.write_text(JOB.read_text().replace("uri: train.jsonl", f"uri: {tasks}"))
    return job, task


@pytest.mark.slow
def test_a_warm_started_policy_samples_two_pi_tool_rounds_on_vllm_and_its_trace_is_token_faithful(
        vllm_server: Any, harness_binaries: Any, tmp_path: Path) -> None:
    import torch

    from tracefleet.api.manifest import load_job
    from tracefleet.trainer.grpo import load_policy, save_weights, sft, token_logprobs, trainable

    job_path, task = one_task_job(tmp_path)
    found = demos.record(job_path, tmp_path / "demos", 1)
    assert found.accepted == 1, (tmp_path / "demos" / "record.log").read_text()[-3000:]
    torch.manual_seed(0)
    model_dir = served_model_dir(vllm_server.url)
    policy = load_policy(model_dir, 4)
    warm = sft(policy, torch.optim.AdamW(trainable(policy), lr=WARM_LR), demos.tensors(demos.rewarded(found)),
               epochs=WARM_EPOCHS)
    engine = EngineControl(vllm_server.url)
    try:
        update_policy([vllm_server.url], save_weights(policy, tmp_path / "policy-1"), 1)
        job = load_job(job_path)
        with open(tmp_path / "run.log", "w") as out:
            run = LocalRun(LocalOptions(job_path=job_path, output=str(tmp_path / "out"), engine_url=vllm_server.url,
                                        work_dir=tmp_path / "work", parallelism=1), out=out, summary=out)
            run.job = with_tasks(job, job_tasks(job, job_path.parent), 1, 1)  # one session
            run.run()
        reader = BatchReader(str(tmp_path / "out"), job.name)
        rows = [row for m in reader.batches() for row in reader.read(m).table.to_pylist()]
        log = (tmp_path / "run.log").read_text()[-3000:]
        assert len(rows) == 1, log
        row = rows[0]
        records = session_records(tmp_path / "work" / "capture", row["session_id"])
        tool_rounds = [r for r in records.values() if r.tool_calls]
        assert len(tool_rounds) >= 2, ([r.output_text for r in records.values()], warm["nll"], log)
        assert all(r.engine_url.startswith(vllm_server.url) for r in records.values())  # real vLLM sampled them
        assert trace_problems(row, records) == []  # mask = exactly the sampled tokens, in one exact chain
        assert len(row["spans"]) == len(records) and {s["policy_version"] for s in row["spans"]} == {1}
        # sampled at the job's temperature (spec.inference.sampling), not Pi's (it sends none), as the spans say
        assert {s["temperature"] for s in row["spans"]} == {job.spec.inference.sampling.temperature} != {None}

        t = reader.read(reader.batches()[0]).tensors()
        on = t["loss_mask"] > 0
        assert int(on.sum()) == sum(len(r.completion_ids) for r in records.values())
        with torch.no_grad():
            mine = token_logprobs(policy, t["input_ids"], t["attention_mask"], t["temperatures"])
        worst = float((mine - t["old_logprobs"])[on].abs().max())
        assert worst < LOGPROB_TOLERANCE, worst
    finally:
        restore_served_weights(engine, Path(model_dir))
    print(f"warm start NLL {warm['nll'][0]:.3f} -> {warm['nll'][-1]:.4f}; {len(records)} calls, "
          f"{len(tool_rounds)} tool rounds ({[c['name'] for r in tool_rounds for c in r.tool_calls]}), reward "
          f"{row['reward']}, {int(on.sum())} trainable of {row['num_tokens']} tokens; trainer vs vLLM max "
          f"|d logprob| {worst:.2e}")
