"""Entrypoints of the pods the operator creates (same image): `python -m tracefleet.operator.podmain seal|evaluate`.

Configuration comes from the environment the child builders set (children.py); bucket credentials
come from the job's Secret as AWS_* variables (tracefleet.bucket reads them).

    seal      build traces for the sessions in TRACEFLEET_SESSIONS from their capture logs and
              rewards, and seal them as one batch with batch_id k8s-<TRACEFLEET_BATCH_SEQ>
              (a rerun of the Job finds the same batch instead of sealing twice).
    evaluate  run TRACEFLEET_COMMAND_JSON against the session's downloaded artifacts and write
              reward.json (reward 1.0 on exit 0, 0.0 otherwise; JSON {"reward": x} on stdout wins).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tracefleet.bucket import Bucket, ObjectNotFound, open_bucket

from .bucketio import batch_id_for, session_prefix
from .names import decode_ranges


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"{name} is not set (the operator sets it on the pods it creates)")
    return value


def session_reward(bucket: Bucket, job: str, session: int) -> dict[str, Any]:
    try:
        return json.loads(bucket.get(session_prefix(job, session) + "reward.json"))
    except ObjectNotFound:
        return {"status": "missing"}


def seal(bucket: Bucket, job: str, seq: int, sessions: list[int], builder: str = "prefix-merge") -> dict[str, Any]:
    from tracefleet.traces.build import build_traces
    from tracefleet.traces.schema import SessionInfo
    from tracefleet.traces.seal import Sealer

    traces: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in sessions:
            try:
                data = bucket.get(session_prefix(job, s) + "capture.jsonl")
            except ObjectNotFound:
                continue  # no capture: nothing trainable from this session (fail closed)
            path = Path(tmp) / f"{job}-s{s}.jsonl"
            path.write_bytes(data)
            r = session_reward(bucket, job, s)
            status = r.get("status", "ok") if r.get("status") in ("ok", "error", "timeout", "missing") else "error"
            info = SessionInfo(job=job, session_id=f"{job}-s{s}", reward=r.get("reward"), evaluator_status=status,
                               task_id=r.get("task_id"), sample_index=r.get("sample_index"))
            traces += build_traces(path, builder=builder, session=info).traces
        manifest = Sealer(bucket, job, spool=tmp).seal(traces, batch_id=batch_id_for(seq))
    return manifest.model_dump(mode="json")


def evaluate(bucket: Bucket, job: str, session: int, command: list[str]) -> dict[str, Any]:
    prefix = session_prefix(job, session)
    with tempfile.TemporaryDirectory() as tmp:
        for obj in bucket.list(prefix + "artifacts/"):
            dest = Path(tmp) / obj.key.split("/artifacts/", 1)[1]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(bucket.get(obj.key))
        try:
            proc = subprocess.run(command, cwd=tmp, capture_output=True, text=True,
                                  timeout=float(os.environ.get("TRACEFLEET_TIMEOUT_S", "600")))
            reward = 1.0 if proc.returncode == 0 else 0.0
            try:
                reward = float(json.loads(proc.stdout.strip().splitlines()[-1])["reward"])
            except (ValueError, KeyError, IndexError, TypeError):
                pass
            result = {"reward": reward, "status": "ok", "exit_code": proc.returncode}
        except subprocess.TimeoutExpired:
            result = {"reward": 0.0, "status": "timeout"}
    bucket.put(prefix + "reward.json", json.dumps(result).encode())
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("seal", "evaluate"):
        print(__doc__)
        return 2
    bucket = open_bucket(_env("TRACEFLEET_BUCKET"))
    job = _env("TRACEFLEET_JOB")
    if argv[0] == "seal":
        out = seal(bucket, job, int(_env("TRACEFLEET_BATCH_SEQ")), decode_ranges(_env("TRACEFLEET_SESSIONS")),
                   os.environ.get("TRACEFLEET_BUILDER", "prefix-merge"))
    else:
        out = evaluate(bucket, job, int(_env("TRACEFLEET_SESSION")), json.loads(_env("TRACEFLEET_COMMAND_JSON")))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
