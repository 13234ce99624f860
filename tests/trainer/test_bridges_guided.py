"""A guided prefix through every bridge: a session whose first call the guide answered (CaptureRecord.guided, a
demonstration's turn the policy continued from) is sealed and read by the five bridges (TRL, Tinker, verl, Miles,
prime-rl). Each must hand its trainer the guide's tokens as context (mask 0, no advantage) and only the policy's
sampled spans as trainable, wherever it splits prompt from response."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tracefleet.bucket import open_bucket
from tracefleet.contract.capture import CaptureRecord, CaptureWriter
from tracefleet.traces import BatchReader, SessionInfo, build_traces
from tracefleet.traces.seal import seal_traces
from tracefleet.trainer.bridges import miles, prime_rl, tinker, verl
from tracefleet.trainer.bridges.trl import TrlRollouts

from fixtures.bridge_batches import conversation

JOB = "guided"


def guided_capture(path: Path) -> list[CaptureRecord]:
    """Pi's recorded session (two tool rounds and an answer) with its first call answered by the guide."""
    records = conversation("pi")
    records = [records[0].model_copy(update={"guided": True}), *records[1:]]
    writer = CaptureWriter(path)
    for r in records:
        writer.append(r)
    writer.close()
    return records


def expected_mask(records: list[CaptureRecord]) -> list[int]:
    """Over the whole conversation: 1 on the policy's sampled spans, 0 elsewhere (the guide's turn included)."""
    last = records[-1]
    mask = [0] * (len(last.prompt_ids) + len(last.completion_ids))
    for r in records:
        if not r.guided:
            start = len(r.prompt_ids)
            mask[start : start + len(r.completion_ids)] = [1] * len(r.completion_ids)
    return mask


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[CaptureRecord], Any]:
    tmp = tmp_path_factory.mktemp("guided")
    records = guided_capture(tmp / "s.jsonl")
    traces = []
    for session, reward in (("s0", 1.0), ("s1", 0.0)):  # one group with reward spread: both rows are trained
        info = SessionInfo(job=JOB, session_id=session, group_id="g0", task_id="t0", reward=reward)
        traces += build_traces(tmp / "s.jsonl", session=info).traces
    bucket = open_bucket(str(tmp / "bucket"))
    seal_traces(bucket, JOB, traces)
    return BatchReader(bucket, JOB).read(0), records, bucket


def test_the_guides_turn_is_in_the_trace_as_context(sealed: tuple[Any, list[CaptureRecord], Any]) -> None:
    batch, records, _ = sealed
    guide = records[0]
    mask = expected_mask(records)
    start = len(guide.prompt_ids)
    assert guide.completion_ids and mask[start : start + len(guide.completion_ids)] == [0] * len(guide.completion_ids)
    t = batch.tensors(pad_token_id=0)
    for i in range(2):
        n = len(mask)
        assert t["input_ids"][i, :n].tolist() == records[-1].prompt_ids + records[-1].completion_ids
        assert t["loss_mask"][i, :n].tolist() == mask
        assert (t["token_versions"][i, :n][t["loss_mask"][i, :n] == 0] == -1).all()


def full_masks_by_bridge(batch: Any, bucket: Any) -> dict[str, list[list[int]]]:
    """Each bridge's per-token trainable mask over the whole trace, for each trained row."""
    out: dict[str, list[list[int]]] = {}
    out["verl"] = [[0] * len(o["prompt_ids"]) + o["response_mask"] for o in verl.to_verl(batch)]
    out["miles"] = [[0] * (len(s["tokens"]) - s["response_length"]) + s["loss_mask"] for s in miles.to_miles(batch)]
    out["prime-rl"] = [[int(m) for m in s["mask"]] for s in prime_rl.to_prime_rl(batch)]
    # Tinker's loss reads target token k+1 at position k: a token is trained where its advantage is non-zero
    out["tinker"] = [[0] + [int(a != 0.0) for a in d.loss_fn_inputs["advantages"].data] for d in tinker.datums(batch)]
    trainer = SimpleNamespace(num_generations=2, num_generations_eval=2, model=SimpleNamespace(training=True),
                              accelerator=None, processing_class=SimpleNamespace(pad_token_id=None), eos_token_ids=[2],
                              use_vllm=False, off_policy_mask_threshold=None)
    rows = TrlRollouts(BatchReader(bucket, JOB), follow_options={"poll_s": 0.1, "timeout_s": 5})(["p", "p"], trainer)
    out["trl"] = [[0] * len(p) + m for p, m in zip(rows["prompt_ids"], rows["env_mask"], strict=True)]
    return out


def test_every_bridge_masks_the_guides_tokens(sealed: tuple[Any, list[CaptureRecord], Any]) -> None:
    batch, records, bucket = sealed
    mask = expected_mask(records)
    found = full_masks_by_bridge(batch, bucket)
    assert sorted(found) == ["miles", "prime-rl", "tinker", "trl", "verl"]
    for bridge, masks in found.items():
        assert len(masks) == 2, bridge
        for m in masks:
            # TRL pads a completion that did not end on EOS with one marker token, never trained
            assert m[: len(mask)] == mask and not any(m[len(mask):]), bridge
