"""A Harbor task in its own image as a pod on the real node (tests/fixtures/node.py, tests/fixtures/node_jobs.py): a
RolloutJob whose task source is an s3:// prefix in the in-cluster bucket, applied with kubectl to the chart's operator;
the kubelet runs the harness pod (the proxy native sidecar, the init container that copies the harness image's bundle,
the task container from the task's image, the session program) and the evaluator Job (its verifier a fresh container
of the task image). The agent, `node -e REPORT_JS` from the bundle, runs in the task container and reports what it
sees there: spec.harness.env and a Harbor instruction with newlines byte for byte, task.toml's [environment].env, and
one model call through the proxy. (The comparison with `tracefleet run` of a Harbor job, its rewards and its change
set: tests/operator/test_driver_conformance.py, on the same node.)
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fixtures.harbor_tasks import ANSWER_TEST_SH, INSTRUCTION, MULTI, REPORT_JS, answer_task_toml
from fixtures.node_jobs import CREDENTIALS_SECRET, HARNESS_IMAGE, Installed, run_job
from tracefleet.bucket import open_bucket
from tracefleet.contract import layout
from tracefleet.operator import names as n
from tracefleet.runner.containers.runtime import BASE_IMAGE

JOB = "hbenv"


def test_harness_env_and_the_instruction_reach_the_task_container_on_the_node_byte_for_byte(
        node: Any, installed: Installed, cluster_s3: Any, host_engine: Any, container_runtime: Any) -> None:
    node.load_image(container_runtime, BASE_IMAGE)  # the task's image, as a registry would serve it
    prefix = f"s3://{installed.bucket}/harbor-{uuid.uuid4().hex[:8]}"
    source = open_bucket(f"{prefix}/tasks/env", **cluster_s3.bucket_options())
    toml = answer_task_toml() + '[environment.env]\nTASK_ENV = "from task.toml"\n'
    for rel, text in {"task.toml": toml, "instruction.md": INSTRUCTION, "tests/test.sh": ANSWER_TEST_SH}.items():
        source.put(rel, text.encode())
    manifest = {
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": JOB},
        "spec": {
            "inference": {"external": {"baseUrl": host_engine.url, "model": host_engine.model},
                          "capture": {"mode": "server"}},
            "harness": {"preset": "command", "image": HARNESS_IMAGE, "sessionTimeoutSeconds": 120,
                        "command": ["node", "-e", REPORT_JS], "env": {"MULTI": MULTI}},
            "tasks": {"harbor": {"uri": f"{prefix}/tasks"}},
            "output": {"uri": f"{prefix}/runs", "credentialsSecretRef": {"name": CREDENTIALS_SECRET},
                       "tracesPerBatch": 1},
        },
    }
    status, reader = run_job(node, installed, cluster_s3, manifest)
    (harness,) = [p for p in installed.pods.children(JOB).values()
                  if p.metadata.labels[n.LABEL_COMPONENT] == n.COMPONENT_HARNESS]
    assert BASE_IMAGE in {c.image for c in harness.spec.containers}  # the task container: the task's own image
    runs = open_bucket(f"{prefix}/runs", **cluster_s3.bucket_options())
    stdout = runs.get(layout.artifacts_prefix(JOB, 0) + "harness.stdout").decode()
    report = json.loads(stdout.strip().splitlines()[-1])
    print(json.dumps(report))
    assert (report["multi"], report["prompt"], report["task_env"], report["proxy"]) == (
        MULTI, INSTRUCTION, "from task.toml", 200), report
    (seq,) = reader.seqs()
    (trace,) = reader.read(seq).traces()
    assert (trace.meta.task_id, trace.meta.outcome) == ("env", "ok") and int(trace.loss_mask.sum()) > 0
