"""Sealing and reading against a real S3 server (SeaweedFS) and a local directory."""

from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tracefleet.bucket import BucketNotFound, BucketUnreachable, LocalBucket, S3Bucket, open_bucket
from tracefleet.traces import BatchReader, SealError, Sealer, SessionInfo, Trace, build_traces
from tracefleet.traces.seal import sealed_seqs
from tracefleet.traces.synthetic import SyntheticSession
from fixtures.sealed_jobs import synthetic_traces


def make_traces(tmp: Path, session: str, *, turns: int = 3, reward: float = 1.0, group: str = "g0", seed: int = 0) -> list[Trace]:
    s = SyntheticSession(tmp / f"{session}.jsonl", session, seed=seed)
    prev = s.call(s.tokens(40), 6)
    for _ in range(turns - 1):
        prev = s.call(s.extend(prev, s.tokens(5)), 6, parent=prev)
    s.close()
    info = SessionInfo(job="job", session_id=session, group_id=group, reward=reward, task_id=group)
    return build_traces(tmp / f"{session}.jsonl", session=info).traces


@pytest.fixture(params=["local", "s3"])
def bucket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalBucket | S3Bucket]:
    if request.param == "local":
        yield LocalBucket(tmp_path / "bucket")
    else:
        s3 = request.getfixturevalue("s3")
        yield S3Bucket(s3.create_bucket(), "runs/exp1", **s3.bucket_options())


def test_seal_then_read_roundtrip(bucket: LocalBucket | S3Bucket, tmp_path: Path) -> None:
    traces = make_traces(tmp_path, "s1", turns=4) + make_traces(tmp_path, "s2", reward=0.0, seed=1)
    manifest = Sealer(bucket, "job", spool=tmp_path / "spool").seal(traces)
    assert manifest.seq == 0 and manifest.traces == 2 and manifest.sessions == 2
    assert manifest.tokens == sum(t.num_tokens for t in traces)
    assert manifest.trainable_tokens == sum(t.num_trainable for t in traces)
    assert manifest.reward.mean == 0.5 and manifest.reward.positive == 1
    obj = manifest.objects[0]
    data = bucket.get(f"job/batches/000000/{obj.name}")
    assert len(data) == obj.size and hashlib.sha256(data).hexdigest() == obj.sha256

    reader = BatchReader(bucket, "job")
    assert [m.seq for m in reader.batches()] == [0]
    batch = reader.read(0)
    assert batch.table.schema.field("tokens").type.value_type.bit_width == 32
    assert batch.table.column("logprobs").combine_chunks().values.null_count == sum(t.num_tokens - t.num_trainable for t in traces)
    for got, want in zip(batch.traces(), traces, strict=True):
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_array_equal(got.loss_mask, want.loss_mask)
        np.testing.assert_array_equal(got.logprobs, want.logprobs)  # NaN == NaN for assert_array_equal
        assert got.spans == want.spans and got.meta == want.meta
    assert not list((tmp_path / "spool" / "job").iterdir()), "spool is cleaned after a successful upload"


def test_eight_concurrent_sealers_never_duplicate(bucket: LocalBucket | S3Bucket, tmp_path: Path) -> None:
    per_sealer, sealers = 3, 8
    work = {w: [make_traces(tmp_path, f"w{w}-b{b}", seed=w * 10 + b) for b in range(per_sealer)] for w in range(sealers)}
    barrier = threading.Barrier(sealers)
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def run(w: int) -> None:
        try:
            # Each sealer has its own client/bucket object, as separate processes would.
            own = bucket if isinstance(bucket, LocalBucket) else S3Bucket(bucket.bucket, bucket.prefix, client=bucket.client)
            sealer = Sealer(own, "job", spool=tmp_path / f"spool-{w}")
            barrier.wait(timeout=30)
            results[w] = [sealer.seal(traces).seq for traces in work[w]]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(sealers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    claimed = sorted(s for seqs in results.values() for s in seqs)
    assert claimed == list(range(sealers * per_sealer)), "every seal got its own seq, no gaps"

    reader = BatchReader(bucket, "job")
    manifests = reader.batches()
    assert [m.seq for m in manifests] == claimed
    sessions = [sid for m in manifests for sid in reader.read(m).table.column("session_id").to_pylist()]
    assert sorted(sessions) == sorted(f"w{w}-b{b}" for w in range(sealers) for b in range(per_sealer))
    # Losers' data objects at contested seqs were removed or are orphans nobody lists.
    _, names = sealed_seqs(bucket, "job")
    for m in manifests:
        assert {o.name for o in m.objects} <= names[m.seq]

    # Sealing identical traces again (a rerun) yields the same batch, not a new one.
    again = Sealer(bucket, "job", spool=tmp_path / "spool-rerun").seal(work[0][0])
    assert again.seq == results[0][0]
    assert len(reader.batches()) == sealers * per_sealer


def test_bucket_down_keeps_data_and_later_seal_succeeds(s3_private, tmp_path: Path) -> None:  # noqa: ANN001
    name = s3_private.create_bucket()
    bucket = S3Bucket(name, "runs", max_attempts=2, connect_timeout=1, **s3_private.bucket_options())
    sealer = Sealer(bucket, "job", spool=tmp_path / "spool")
    assert sealer.seal(make_traces(tmp_path, "before")).seq == 0

    s3_private.stop()
    down = make_traces(tmp_path, "during", seed=5)
    with pytest.raises(SealError) as info:
        sealer.seal(down)
    assert isinstance(info.value.__cause__, BucketUnreachable)
    assert "cannot reach" in str(info.value) and str(info.value.spooled) in str(info.value)
    kept = sealer.pending()
    assert kept == [info.value.spooled] and any(p.suffix == ".parquet" for p in kept[0].iterdir())

    s3_private.start()
    flushed = sealer.flush()
    assert [m.seq for m in flushed] == [1] and sealer.pending() == []

    # The store dies mid-seal: data object uploaded, manifest not yet created.
    class DiesBeforeManifest(S3Bucket):
        def create_exclusive(self, key: str, data: bytes) -> bool:
            s3_private.stop()
            return super().create_exclusive(key, data)

    dying = DiesBeforeManifest(name, "runs", max_attempts=2, connect_timeout=1, **s3_private.bucket_options())
    with pytest.raises(SealError) as info:
        Sealer(dying, "job", spool=tmp_path / "spool").seal(make_traces(tmp_path, "midway", seed=7))
    assert isinstance(info.value.__cause__, BucketUnreachable) and info.value.spooled.is_dir()
    s3_private.start()
    assert BatchReader(bucket, "job").seqs() == [0, 1], "the half-written batch is invisible"
    assert [m.seq for m in sealer.flush()] == [2]

    assert sealer.seal(make_traces(tmp_path, "after", seed=6)).seq == 3
    reader = BatchReader(bucket, "job")
    assert [reader.read(s).table.column("session_id").to_pylist() for s in reader.seqs()] == [
        ["before"], ["during"], ["midway"], ["after"]]


def test_lost_manifest_response_does_not_duplicate(bucket: LocalBucket | S3Bucket, tmp_path: Path) -> None:
    """A seal whose manifest landed but whose caller never learned it (crash, timeout) is not redone."""
    sealer = Sealer(bucket, "job", spool=tmp_path / "spool")
    staged = sealer.stage(make_traces(tmp_path, "s"))
    copy = tmp_path / "staged-copy"
    import shutil

    shutil.copytree(staged, copy)
    first = sealer.upload(staged)
    shutil.copytree(copy, staged)  # as if the process died before cleaning its spool
    assert [m.seq for m in sealer.flush()] == [first.seq]
    assert BatchReader(bucket, "job").seqs() == [0]


def test_reader_follows_each_batch_exactly_once_across_restart(bucket: LocalBucket | S3Bucket, tmp_path: Path) -> None:
    sealer = Sealer(bucket, "job", spool=tmp_path / "spool")
    for k in range(2):
        sealer.seal(make_traces(tmp_path, f"s{k}", seed=k))

    seen: list[int] = []
    reader = BatchReader(bucket, "job", consumer="trainer-0")
    got_first = threading.Event()

    def consume(r: BatchReader, limit: int) -> None:
        for batch in r.follow(poll_s=0.1, timeout_s=10):
            seen.append(batch.seq)
            r.commit(batch)
            got_first.set()
            if len(seen) >= limit:
                return

    t = threading.Thread(target=consume, args=(reader, 3))
    t.start()
    assert got_first.wait(30)
    sealer.seal(make_traces(tmp_path, "s2", seed=2))  # sealed while the reader is following
    t.join(timeout=60)
    assert seen == [0, 1, 2]

    # Restart: a fresh reader with the same consumer name resumes after the committed cursor.
    for k in (3, 4):
        sealer.seal(make_traces(tmp_path, f"s{k}", seed=k))
    restarted = BatchReader(bucket, "job", consumer="trainer-0")
    assert restarted.cursor() == 3
    batch = next(restarted.follow(idle_exit=True))
    assert batch.seq == 3  # dies before committing 3 ...
    again = BatchReader(bucket, "job", consumer="trainer-0")
    for b in again.follow(idle_exit=True):  # ... so the next run sees 3 again, then 4
        seen.append(b.seq)
        again.commit(b)
    assert seen == [0, 1, 2, 3, 4]
    assert list(BatchReader(bucket, "job", consumer="trainer-0").follow(idle_exit=True)) == []
    # another consumer has its own cursor
    assert [b.seq for b in BatchReader(bucket, "job", consumer="eval").follow(idle_exit=True)] == [0, 1, 2, 3, 4]


def test_clear_errors_for_missing_or_unreachable_bucket(s3, tmp_path: Path) -> None:  # noqa: ANN001
    with pytest.raises(BucketNotFound, match="does not exist"):
        S3Bucket("no-such-bucket-tf", "", **s3.bucket_options()).check()
    with pytest.raises(SealError) as info:
        Sealer(S3Bucket("no-such-bucket-tf", "x", **s3.bucket_options()), "job", spool=tmp_path / "sp").seal(make_traces(tmp_path, "a"))
    assert isinstance(info.value.__cause__, BucketNotFound)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    opts = dict(s3.bucket_options(), endpoint_url=f"http://127.0.0.1:{port}")
    with pytest.raises(BucketUnreachable, match="cannot reach"):
        open_bucket("s3://whatever/p", max_attempts=1, connect_timeout=1, **{k: v for k, v in opts.items()}).check()
    with pytest.raises(BucketNotFound):
        LocalBucket(tmp_path / "absent", create=False).check()


def test_padded_tensors_and_group_advantages(tmp_path: Path) -> None:
    import torch

    from tracefleet.traces import group_advantages

    bucket = LocalBucket(tmp_path / "b")
    traces = []
    for i, r in enumerate([1.0, 0.0, 0.0, 1.0]):
        traces += make_traces(tmp_path, f"g1-{i}", turns=2 + i, reward=r, group="g1", seed=i)
    traces += make_traces(tmp_path, "solo", reward=1.0, group="g2", seed=9)
    Sealer(bucket, "job", spool=tmp_path / "sp").seal(traces)
    batch = BatchReader(bucket, "job").read(0)
    t = batch.tensors(pad_token_id=-1)
    b, n = t["input_ids"].shape
    assert b == 5 and n == max(x.num_tokens for x in traces)
    for i, tr in enumerate(traces):
        k = tr.num_tokens
        assert t["input_ids"][i, :k].tolist() == tr.tokens.tolist() and (t["input_ids"][i, k:] == -1).all()
        assert t["attention_mask"][i].sum().item() == k
        assert t["loss_mask"][i, :k].tolist() == tr.loss_mask.tolist()
        lp = t["old_logprobs"][i]
        assert torch.equal(lp[:k][t["loss_mask"][i, :k] > 0], torch.from_numpy(tr.logprobs[tr.loss_mask == 1]))
        assert (lp[t["loss_mask"][i] == 0] == 0).all()
    # GRPO: rewards 1,0,0,1 → mean .5, std .5 → ±1; the lone sample in g2 gets 0
    assert np.allclose(t["sequence_advantages"].numpy(), [1, -1, -1, 1, 0], atol=1e-4)
    assert torch.equal(t["advantages"], t["loss_mask"] * t["sequence_advantages"][:, None])
    loo = group_advantages([1.0, 0.0, 0.0, 1.0], ["g"] * 4, leave_one_out=True, normalize_std=False)
    assert np.allclose(loo, [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3])
    # several traces of one session count once in the group statistics
    shared = group_advantages([1.0, 1.0, 0.0], ["g", "g", "g"], ["a", "a", "b"], normalize_std=False)
    assert np.allclose(shared, [0.5, 0.5, -0.5])


def test_the_sealer_of_every_hundredth_batch_packs_the_hundred_manifests(tmp_path: Path) -> None:
    """tracefleet.contract.batch.ManifestPack: written by the sealer of batch 99 (and 199...), the manifests as sealed."""
    from tracefleet.contract.batch import ManifestPack
    from tracefleet.contract.layout import manifest_pack_key, packs_prefix

    bucket = open_bucket(tmp_path / "out")
    sealer = Sealer(bucket, "packed", spool=tmp_path / "spool")
    sealed = [sealer.seal(synthetic_traces(i, 1, job="packed")) for i in range(101)]
    assert [o.key for o in bucket.list(packs_prefix("packed"))] == [manifest_pack_key("packed", 0)]
    pack = ManifestPack.model_validate_json(bucket.get(manifest_pack_key("packed", 0)))
    assert (pack.first, pack.manifests) == (0, sealed[:100])
