"""Faults on the real node (tests/fixtures/node.py, the chart and the bucket of tests/fixtures/node_jobs.py): a harness
pod deleted mid-session, the operator's pod deleted mid-job. For each: every call the proxy captured is in the sealed
batches a trainer reads, the job retries what its semantics say (a session that made a model call is data, never run
again), its status and Events say what happened, and nothing of the job is left once its TTL has passed.

The harness (the `command` preset, in the tracefleet image) makes two calls to the engine (the scripted `tracefleet
engine` on this machine's address); the second carries HOLD, which the engine holds HOLD_S before its first token. So
when the engine reports one request running, the session has one call answered and one in flight: the fault lands
there.

Measured (2 cores, shared): mid-session 6-8 s after `kubectl apply`; the deleted pod's session ran again and the job
Succeeded 47-54 s after apply (HOLD_S 20 s each run); with the operator's pod deleted, Succeeded 35-50 s after apply;
each job and its children gone within 3 s of its TTL (3 s).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from fixtures.node_jobs import (
    CALLING_HARNESS,
    NAMESPACE,
    RELEASE,
    Installed,
    children_left,
    job_events,
    kubectl_apply,
    wait_for,
)
from tracefleet.bucket import open_bucket
from tracefleet.contract import layout
from tracefleet.contract.capture import CaptureRecord, read_capture_log
from tracefleet.operator import names as n
from tracefleet.traces.reader import BatchReader

HOLD = "[tracefleet-hold]"
HOLD_S = 20.0
TTL_S = 3
HARNESS = CALLING_HARNESS + f"""
call(prompt)
call(prompt + " {HOLD}")
"""


def held_job(name: str, engine_url: str, bucket: str, *, samples: int) -> dict[str, Any]:
    return {
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": name},
        "spec": {
            "inference": {"external": {"baseUrl": engine_url}, "capture": {"mode": "server"}},
            "harness": {"preset": "command", "command": ["python", "-c", HARNESS], "sessionTimeoutSeconds": 120},
            "tasks": {"inline": [{"id": "t", "prompt": "Say something."}], "samplesPerTask": samples},
            "evaluator": {"preset": "command", "timeoutSeconds": 60, "command": ["true"]},
            "output": {"uri": f"s3://{bucket}/{name}", "tracesPerBatch": samples,
                       "credentialsSecretRef": {"name": "bucket-credentials"}},
            "parallelism": samples,
            "ttlSecondsAfterFinished": TTL_S,
        },
    }


@pytest.fixture
def holding_engine(host_engine):
    host_engine.configure(routes=[{"marker": HOLD, "first_token_delay_s": HOLD_S}])
    yield host_engine
    host_engine.reset()


def finished(cluster: Installed, job: str, timeout_s: float = 300) -> dict[str, Any]:
    def phase() -> dict[str, Any] | None:
        status = cluster.status(job)
        return status if status and status.get("phase") in ("Succeeded", "Failed") else None
    return wait_for(f"{job} finished", phase, timeout_s)


def capture_records(s3, uri: str, key: str, tmp_path: Path) -> list[CaptureRecord]:
    """The calls in a capture log in the bucket (what a proxy sidecar uploaded)."""
    local = tmp_path / key.replace("/", "_")
    local.write_bytes(open_bucket(uri, **s3.bucket_options()).get(key))
    return read_capture_log(local).records


def gone_after_ttl(node, cluster: Installed, job: str) -> float:
    """Seconds from now until the job and every child of it are gone."""
    start = time.monotonic()

    def report() -> str:
        got = node.kube.kubectl("-n", NAMESPACE, "get", "rolloutjob", job, "-o", "jsonpath={.metadata}").stdout
        return f"{got}\n{children_left(node.kube, job)}\n{cluster.operator_log()}"

    wait_for(f"{job} deleted after its TTL", lambda: cluster.status(job) is None, 60, report=report)
    wait_for(f"{job}'s children deleted", lambda: not children_left(node.kube, job), 90, every_s=1, report=report)
    return time.monotonic() - start


def test_a_harness_pod_deleted_mid_session(node, installed: Installed, holding_engine, cluster_s3,
                                           tmp_path: Path) -> None:
    job = "fault-pod"
    manifest = held_job(job, holding_engine.url, installed.bucket, samples=2)
    applied = kubectl_apply(node.kube, manifest)
    wait_for("both sessions mid-way (one call answered, one held)", lambda: holding_engine.running() == 2, 120, 0.2)
    mid = time.monotonic() - applied
    victim = n.harness_pod_name(job, 1, 0)
    r = node.kube.kubectl("-n", NAMESPACE, "delete", "pod", victim, "--wait=false")
    assert r.returncode == 0, r.stderr
    status = finished(installed, job)
    done = time.monotonic() - applied
    events = job_events(node.kube, job)
    print(f"{job}: mid-session {mid:.1f} s after apply, {status.get('phase')} {done:.1f} s after apply; "
          f"events {events}; status {json.dumps(status)}")
    assert status["phase"] == "Succeeded" and status["counters"]["succeeded"] == 2, status
    # The session was stopped (semantics: neither failed nor retried, it runs again): the same pod, made anew
    phases = installed.pods.phases[victim]
    assert phases.count("Running") == 2 and phases[-1] == "Succeeded", phases
    uri = manifest["spec"]["output"]["uri"]
    bucket = open_bucket(uri, **cluster_s3.bucket_options())
    stopped_keys = [o.key for o in bucket.list(layout.session_prefix(job, 1) + layout.STOPPED)]
    (stopped_capture,) = [k for k in stopped_keys if k.endswith("/" + layout.CAPTURE_LOG)]
    (stopped_result,) = [k for k in stopped_keys if k.endswith("/" + layout.ARTIFACTS + layout.RESULT)]
    assert json.loads(bucket.get(stopped_result))["status"] == "stopped"
    # every call the stopped run captured is kept: the answered one, and the one the pod's end cut
    kept = capture_records(cluster_s3, uri, stopped_capture, tmp_path)
    print(f"{job}: the stopped run's calls {[(r.status, r.error and r.error.kind) for r in kept]}")
    assert [r.status for r in kept][:1] == ["ok"], [(r.status, r.error) for r in kept]
    # what is sealed is the run that finished, its two calls
    assert len(capture_records(cluster_s3, uri, layout.capture_key(job, 1), tmp_path)) == 2
    reader = BatchReader(open_bucket(uri, **cluster_s3.bucket_options()), job)
    traces = [t for seq in reader.seqs() for t in reader.read(seq).traces()]
    assert sorted({t.meta.session_id for t in traces}) == [f"{job}-s0", f"{job}-s1"]
    print(f"{job}: gone {gone_after_ttl(node, installed, job):.1f} s after TTL wait began")


def test_the_operator_pod_deleted_mid_job(node, installed: Installed, holding_engine, cluster_s3,
                                          tmp_path: Path) -> None:
    job = "fault-operator"
    manifest = held_job(job, holding_engine.url, installed.bucket, samples=2)
    applied = kubectl_apply(node.kube, manifest)
    wait_for("both sessions mid-way (one call answered, one held)", lambda: holding_engine.running() == 2, 120, 0.2)
    (operator,) = [name for name, pod in installed.pods.last.items()
                   if name.startswith(f"{RELEASE}-tracefleet-") and not pod.metadata.deletion_timestamp]
    r = node.kube.kubectl("-n", NAMESPACE, "delete", "pod", operator, "--wait=false")
    assert r.returncode == 0, r.stderr
    status = finished(installed, job)
    done = time.monotonic() - applied
    events = job_events(node.kube, job)
    print(f"{job}: {status.get('phase')} {done:.1f} s after apply; events {events}; status {json.dumps(status)}")
    assert status["phase"] == "Succeeded", status
    assert status["counters"]["succeeded"] == 2
    harness = sorted(name for name, pod in installed.pods.last.items() if pod.metadata.labels.get(n.LABEL_JOB) == job
                     and pod.metadata.labels.get(n.LABEL_COMPONENT) == n.COMPONENT_HARNESS)
    # each session's one pod ran once: the operator that came back took the job up where it was
    assert harness == [n.harness_pod_name(job, 0, 0), n.harness_pod_name(job, 1, 0)], harness
    assert all(installed.pods.phases[p].count("Running") == 1 for p in harness), installed.pods.phases
    reader = BatchReader(open_bucket(manifest["spec"]["output"]["uri"], **cluster_s3.bucket_options()), job)
    traces = [t for seq in reader.seqs() for t in reader.read(seq).traces()]
    assert len(traces) >= 2 and sorted({t.meta.session_id for t in traces}) == [f"{job}-s0", f"{job}-s1"]
    for s in (0, 1):
        assert len(capture_records(cluster_s3, manifest["spec"]["output"]["uri"], layout.capture_key(job, s),
                                   tmp_path)) == 2
    print(f"{job}: gone {gone_after_ttl(node, installed, job):.1f} s after TTL wait began")
