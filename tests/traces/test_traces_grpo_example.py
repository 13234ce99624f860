"""examples/grpo runs a real torch GRPO step over a batch sealed into the S3 server (CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tracefleet.bucket import S3Bucket
from tracefleet.traces import BatchReader

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo" / "train_step.py"


def test_grpo_example_trains_on_a_sealed_batch(s3, tmp_path: Path) -> None:  # noqa: ANN001
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import train_step  # the example module itself
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    name = s3.create_bucket()
    uri = f"s3://{name}/runs"
    env = {**os.environ, **s3.env(), "OMP_NUM_THREADS": "1"}
    # Seal the demo job in-process (through the same S3 env), then run the example as a user would.
    old = {k: os.environ.get(k) for k in s3.env()}
    os.environ.update(s3.env())
    try:
        train_step.seal_demo_job(uri, "grpo")
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    run = subprocess.run([sys.executable, str(EXAMPLE), "--bucket", uri, "--job", "grpo", "--consumer", "ci"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    row = json.loads(run.stdout.strip().splitlines()[-1])
    assert row["seq"] == 0 and row["traces"] == 8 and row["trainable_tokens"] == 8 * 3 * 8
    # One optimizer step on the clipped GRPO objective improves it on the same batch.
    assert row["loss_after"] < row["loss_before"] and row["grad_norm"] > 0
    # The batch was committed: a second run finds nothing new.
    again = subprocess.run([sys.executable, str(EXAMPLE), "--bucket", uri, "--job", "grpo", "--consumer", "ci"],
                           capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 1 and "no unconsumed batches" in again.stdout
    assert BatchReader(S3Bucket(name, "runs", **s3.bucket_options()), "grpo", consumer="ci").cursor() == 1


def test_grpo_loss_gradient_favours_positive_advantages() -> None:
    """Direct check of the objective: after a step, sampled tokens with positive advantage become more
    likely and those with negative advantage (inside the clip range) less likely."""
    import torch

    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import train_step
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    torch.manual_seed(0)
    policy = train_step.TinyPolicy(64, max_len=32)
    ids = torch.randint(1, 64, (2, 16))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    mask = torch.zeros(2, 16)
    mask[:, 8:] = 1
    with torch.no_grad():
        old = torch.cat([torch.zeros(2, 1), train_step.token_logprobs(policy, batch)], dim=1) * mask
    adv = torch.tensor([[1.0], [-1.0]]) * mask
    batch |= {"loss_mask": mask, "old_logprobs": old, "advantages": adv}
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    loss = train_step.grpo_loss(policy, batch)
    loss.backward()
    opt.step()
    with torch.no_grad():
        new = train_step.token_logprobs(policy, batch)
    delta = ((new - old[:, 1:]) * mask[:, 1:]).sum(dim=1)
    assert delta[0] > 0 > delta[1]


def test_grpo_new_logprobs_are_taken_at_each_spans_sampling_temperature() -> None:
    """The ratio's denominator is the engine's logprob of the distribution that sampled: the example
    scores each sampled token at the temperature its span records (the call's default where none), which the
    reader gives as `temperatures`."""
    import torch

    from tracefleet.traces.schema import Span

    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import train_step
    finally:
        sys.path.remove(str(EXAMPLE.parent))

    from tracefleet.traces.batch import traces_to_table
    from tracefleet.traces.reader import padded_tensors
    from tracefleet.traces.schema import Trace, TraceMetadata

    spans = [Span(call_id="a", prompt_start=0, completion_start=2, completion_end=4, policy_version=0, temperature=0.5),
             Span(call_id="b", prompt_start=4, completion_start=6, completion_end=8, policy_version=0)]
    mask = np.array([0, 0, 1, 1, 0, 0, 1, 1, 0], np.uint8)
    trace = Trace(tokens=np.arange(1, 10, dtype=np.int32), loss_mask=mask,
                  logprobs=np.where(mask > 0, -1.0, np.nan).astype(np.float32), spans=spans,
                  meta=TraceMetadata(trace_id="t", session_id="s", reward=1.0))
    temps = padded_tensors(traces_to_table([trace]), temperature=0.8)["temperatures"]
    assert torch.equal(temps, torch.tensor([[1.0, 1.0, 0.5, 0.5, 1.0, 1.0, 0.8, 0.8, 1.0]]))
    torch.manual_seed(0)
    policy = train_step.TinyPolicy(16, max_len=16)
    ids = torch.randint(1, 16, (1, 9))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        logits = policy(ids[:, :-1], batch["attention_mask"][:, :-1])
        expected = torch.log_softmax(logits / temps[:, 1:, None], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        assert torch.allclose(train_step.token_logprobs(policy, batch | {"temperature": temps}), expected)
        assert not torch.allclose(train_step.token_logprobs(policy, batch), expected)
