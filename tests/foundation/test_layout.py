"""The bucket layout (tracefleet.contract.layout): the keys trainers, reruns and the pods rely on, pinned as
strings, and a real seal + read + cursor commit into a directory bucket landing exactly there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracefleet.contract import layout
from tracefleet.bucket import LocalBucket
from tracefleet.traces import BatchReader, Sealer, SessionInfo, build_traces
from tracefleet.traces.synthetic import SyntheticSession


def test_keys_are_the_documented_layout() -> None:
    assert layout.manifest_key("job", 3) == "job/batches/000003/manifest.json"
    assert layout.batch_object_key("job", 3, layout.data_object_name("b1")) == "job/batches/000003/traces-b1.parquet"
    assert layout.cursor_key("job", "trainer-0") == "job/consumers/trainer-0.json"
    assert layout.capture_key("job", 7) == "job/sessions/7/capture.jsonl"
    assert layout.reward_key("job", 7) == "job/sessions/7/reward.json"
    assert layout.artifacts_prefix("job", 7) + layout.PATCH == "job/sessions/7/artifacts/session.patch"
    assert layout.session_uri("s3://b/runs/", "job", 7) == "s3://b/runs/job/sessions/7/"
    assert layout.batch_uri("s3://b/runs", "job", 12) == "s3://b/runs/job/batches/000012/"


def test_batch_keys_parse_back() -> None:
    assert layout.batch_key_parts("job", "job/batches/000003/manifest.json") == (3, "manifest.json")
    # a listing of a bucket under a prefix carries the prefix in front
    assert layout.batch_key_parts("job", "runs/exp/job/batches/1234567/traces-x.parquet") == (1234567, "traces-x.parquet")
    for other in ("job/batches/000003/", "job/batches/3/manifest.json", "job/batches/notes.txt"):
        assert layout.batch_key_parts("job", other) is None


def test_overlay_keys_are_one_folder_per_diagnostic_and_parse_back() -> None:
    assert layout.evidence_key("job", "s1") == "job/evidence/s1.json"
    assert layout.overlay_key("job", "protected_files", "0001-ab") == "job/overlays/protected_files/0001-ab.json"
    assert layout.overlay_key_parts("job", "job/overlays/protected_files/0001-ab.json") == ("protected_files", "0001-ab")
    assert layout.overlay_key_parts("job", "runs/job/overlays/mine/2.json") == ("mine", "2")
    for other in ("job/overlays/x/", "job/overlays/x/a/b.json", "job/overlays/x/notes.txt"):
        assert layout.overlay_key_parts("job", other) is None
    for bad in ("a/b", "..", "has space"):
        with pytest.raises(ValueError, match="cannot name an overlay"):
            layout.overlay_key("job", bad, "1")


@pytest.mark.parametrize("bad", ["", "a/b", ".", ".."])
def test_a_job_name_is_one_path_segment(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid job name"):
        layout.job_root(bad)


def test_a_sealed_batch_and_a_cursor_are_where_the_layout_says(tmp_path: Path) -> None:
    s = SyntheticSession(tmp_path / "s1.jsonl", "s1", seed=0)
    s.call(s.tokens(20), 4)
    s.close()
    traces = build_traces(tmp_path / "s1.jsonl", session=SessionInfo(job="job", session_id="s1", reward=1.0)).traces
    bucket = LocalBucket(tmp_path / "bucket")
    manifest = Sealer(bucket, "job", spool=tmp_path / "spool").seal(traces, batch_id="b1")
    reader = BatchReader(bucket, "job", consumer="trainer-0")
    reader.commit(reader.read(manifest.seq))
    keys = {o.key for o in bucket.list("job/")}
    assert keys == {layout.manifest_key("job", 0), layout.batch_object_key("job", 0, layout.data_object_name("b1")),
                    layout.cursor_key("job", "trainer-0")}
