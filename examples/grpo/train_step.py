"""A real GRPO policy-gradient step with torch, on CPU, over sealed trace batches.

The policy is a tiny randomly initialised causal transformer (the point is the plumbing, not the
model): it reads each batch through `tracefleet.traces.BatchReader` exactly as a trainer would, computes
the clipped GRPO objective on the trainable (sampled) tokens only, with the engine's logprobs as the
behaviour policy and group-relative advantages, takes an optimizer step, and commits the batch so a
restart does not train on it twice.

    python examples/grpo/train_step.py --bucket ./batches --job my-job            # directory bucket
    AWS_ENDPOINT_URL=http://127.0.0.1:8333 python examples/grpo/train_step.py --bucket s3://rl/runs --job my-job
    python examples/grpo/train_step.py --demo                                     # seals a synthetic job first

Prints one JSON line per batch: seq, traces, trainable tokens, loss before and after the step.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from typing import Any

import torch
from torch import nn

from tracefleet.traces import BatchReader, RawLogprobs


class TinyPolicy(nn.Module):
    def __init__(self, vocab: int, dim: int = 64, layers: int = 2, heads: int = 4, max_len: int = 4096) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x = self.embed(ids) + self.pos(torch.arange(t, device=ids.device))[None]
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).triu(1)  # True = may not attend
        x = self.body(x, mask=causal, src_key_padding_mask=attention_mask == 0, is_causal=True)
        return self.head(x)


def token_logprobs(policy: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """log p(token_t | tokens_<t) for t >= 1, shape [B, T-1], under the policy's logits divided by the
    temperature token t was sampled at (`batch["temperature"]`, [B, T]; 1 when absent): the ratio to
    `old_logprobs` is only meaningful when both are taken from the same distribution."""
    ids = batch["input_ids"]
    logits = policy(ids[:, :-1], batch["attention_mask"][:, :-1]).float()
    if "temperature" in batch:
        logits = logits / batch["temperature"][:, 1:, None]
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def grpo_loss(policy: nn.Module, batch: dict[str, torch.Tensor], clip: float = 0.2) -> torch.Tensor:
    """Clipped surrogate on sampled tokens, averaged over trainable tokens (token-level GRPO/DAPO).

    `old_logprobs` are the engine's. tracefleet runs vLLM with `--logprobs-mode processed_logprobs`
    (tracefleet.vllm: the operator's Deployment, `tracefleet engine --backend vllm`, the tests' server), so they
    are the logprobs of the distribution that sampled, after temperature and top-k/top-p; vLLM's own default,
    `raw_logprobs`, would give the T=1 distribution's whatever the sampling. Each span records which it holds
    (`logprobs_mode`), and `batch.tensors()` refuses raw ones unless `--allow-raw-logprobs`. The new logprobs are
    taken at the temperature each span records (the reader's `temperatures`). Top-p/top-k truncation is not
    re-applied here: keep them off for on-policy training."""
    mask = batch["loss_mask"][:, 1:]
    new = token_logprobs(policy, batch)
    ratio = torch.exp(new - batch["old_logprobs"][:, 1:])
    adv = batch["advantages"][:, 1:]
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    return -(surrogate * mask).sum() / mask.sum().clamp(min=1)


def train(bucket: str, job: str, consumer: str, *, lr: float, max_batches: int, seed: int,
          temperature: float = 1.0, allow_raw_logprobs: bool = False, vocab: int = 1 << 16,
          max_len: int = 4096) -> list[dict[str, float]]:
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    reader = BatchReader(bucket, job=job, consumer=consumer)
    policy: TinyPolicy | None = None
    opt: torch.optim.Optimizer | None = None
    out: list[dict[str, float]] = []
    for batch in reader.follow(idle_exit=True):
        t = batch.tensors(pad_token_id=0, temperature=temperature,
                          allow_raw_logprobs=allow_raw_logprobs)  # RawLogprobs: not behaviour ones
        # this toy model has no tokenizer of its own: its tables are sized for every batch it may read
        top, length = int(t["input_ids"].max().item()), int(t["input_ids"].shape[1])
        if top >= vocab or length > max_len:
            raise SystemExit(f"batch {batch.seq}: token id {top} / length {length} beyond the toy policy's "
                             f"--vocab {vocab} / --max-len {max_len}: pass larger ones")
        if policy is None:
            policy = TinyPolicy(vocab, max_len=max_len)
            opt = torch.optim.Adam(policy.parameters(), lr=lr)
        assert opt is not None
        t["temperature"] = t["temperatures"]
        loss = grpo_loss(policy, t)
        opt.zero_grad()
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0))
        opt.step()
        with torch.no_grad():
            after = float(grpo_loss(policy, t))
        reader.commit(batch)  # only after the step: a crash before this replays the batch
        row = {
            "seq": batch.seq,
            "traces": int(t["input_ids"].shape[0]),
            "trainable_tokens": int(t["loss_mask"].sum().item()),
            "loss_before": float(loss.detach()),
            "loss_after": after,
            "grad_norm": grad_norm,
        }
        assert math.isfinite(row["loss_before"]) and math.isfinite(after)
        print(json.dumps(row), flush=True)
        out.append(row)
        if len(out) >= max_batches:
            break
    return out


def seal_demo_job(bucket: str, job: str) -> None:
    """A synthetic job: 2 tasks x 4 samples, multi-turn sessions, rewards 0/1, sealed in one batch."""
    from pathlib import Path

    from tracefleet.bucket import open_bucket
    from tracefleet.traces import Sealer, SessionInfo, build_traces
    from tracefleet.traces.synthetic import SyntheticSession

    tmp = Path(tempfile.mkdtemp(prefix="tf-grpo-"))
    traces = []
    for task in range(2):
        for sample in range(4):
            sid = f"t{task}-s{sample}"
            s = SyntheticSession(tmp / f"{sid}.jsonl", sid, seed=task * 10 + sample, vocab=512)
            prev = s.call(s.tokens(24), 8)
            for _ in range(2):
                prev = s.call(s.extend(prev, s.tokens(6)), 8, parent=prev)
            s.close()
            info = SessionInfo(job=job, session_id=sid, task_id=f"task-{task}", group_id=f"task-{task}",
                               sample_index=sample, reward=float((sample + task) % 2))
            traces += build_traces(tmp / f"{sid}.jsonl", session=info).traces
    Sealer(open_bucket(bucket), job, spool=tmp / "spool").seal(traces)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bucket", help="s3://bucket/prefix or a directory")
    p.add_argument("--job", default="grpo-demo")
    p.add_argument("--consumer", default="grpo-example")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--max-batches", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0,
                   help="the temperature of calls that left it to the engine (their spans record none); "
                        "calls that set one are trained at the temperature their spans record")
    p.add_argument("--allow-raw-logprobs", action="store_true",
                   help="train on spans whose logprobs are raw (vLLM's default --logprobs-mode: taken before "
                        "temperature/top-k/top-p) as if they were the behaviour policy's; refused otherwise")
    p.add_argument("--vocab", type=int, default=1 << 16,
                   help="the toy policy's vocabulary (65536: SmolLM2's 49152 ids fit; Gemma 3 needs 262144)")
    p.add_argument("--max-len", type=int, default=4096, help="the toy policy's longest sequence")
    p.add_argument("--demo", action="store_true", help="seal a synthetic job into --bucket (default: a temp dir) first")
    args = p.parse_args()
    bucket = args.bucket or tempfile.mkdtemp(prefix="tf-grpo-bucket-")
    if args.demo:
        seal_demo_job(bucket, args.job)
    try:
        rows = train(bucket, args.job, args.consumer, lr=args.lr, max_batches=args.max_batches, seed=args.seed,
                     temperature=args.temperature, allow_raw_logprobs=args.allow_raw_logprobs,
                     vocab=args.vocab, max_len=args.max_len)
    except RawLogprobs as exc:
        print(f"train_step: {exc} (here: --allow-raw-logprobs)", file=sys.stderr)
        return 2
    if not rows:
        print(f"no unconsumed batches for job {args.job!r} in {bucket}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
