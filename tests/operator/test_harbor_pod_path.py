"""A Harbor job's session on the cluster path, every container run for real: the pods the operator builds from a
RolloutJob whose task source is an s3:// prefix on the real S3 server, the tracefleet-image containers (proxy
sidecar, session program, the evaluator's fetch and report steps) as local processes with the kubelet's mapping
(fixtures.pods), the task-image containers (the harness's launcher, the verifier) in podman with the base image, the
harness bundle's own Node.js running the agent in the task container against the proxy and the scripted engine.
What a trainer reads at the end is the session, its capture and Harbor's reward.
"""

from __future__ import annotations

import json
from pathlib import Path

from fixtures.harbor_tasks import ANSWER_AGENT_JS, ANSWER_TEST_SH, INSTRUCTION, MULTI, REPORT_JS, answer_task_toml
from fixtures.pods import child_kubelet, run_job_container, run_task_image_job, run_task_image_pod
from fixtures.plans import plan_of
from tracefleet.bucket import open_bucket
from tracefleet.contract import task_image as ti
from tracefleet.contract.job import RolloutJob
from tracefleet.operator.children.harness import harness_pod
from tracefleet.operator.children.jobs import evaluator_job, sealer_job
from tracefleet.operator.config import OperatorConfig
from tracefleet.operator.harbor_tasks import read_source
from tracefleet.runner.containers.runtime import BASE_IMAGE
from tracefleet.traces.reader import BatchReader


def harbor_job(name: str, bucket_name: str, engine, harness: dict) -> RolloutJob:  # noqa: ANN001 - the fixture's
    """A RolloutJob on the task folders under s3://BUCKET/tasks, the `command` preset with `harness`'s fields."""
    return RolloutJob.model_validate({
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob",
        "metadata": {"name": name, "namespace": "default", "uid": f"0c1d2e3f-{name}"},
        "spec": {
            "inference": {"external": {"baseUrl": engine.url, "model": engine.model}, "capture": {"mode": "server"}},
            "harness": {"preset": "command", "image": "reg.local/bundle:1", "sessionTimeoutSeconds": 120, **harness},
            "tasks": {"harbor": {"uri": f"s3://{bucket_name}/tasks"}},
            "output": {"uri": f"s3://{bucket_name}/runs", "credentialsSecretRef": {"name": "bucket-credentials"},
                       "tracesPerBatch": 1},
        },
    })


def test_harbor_session_runs_in_its_task_image_and_is_judged_by_its_tests(scripted_engine, s3, container_runtime,
                                                                          tmp_path: Path) -> None:
    scripted_engine.configure(no_tools_text="42")
    bucket_name = s3.create_bucket()
    source = open_bucket(f"s3://{bucket_name}/tasks/answer", **s3.bucket_options())
    for rel, text in {"task.toml": answer_task_toml(), "instruction.md": "Write the answer to answer.txt.\n",
                      "tests/test.sh": ANSWER_TEST_SH}.items():
        source.put(rel, text.encode())
    job = harbor_job("hbpath", bucket_name, scripted_engine, {
        "command": ["node", "-e", ANSWER_AGENT_JS, "{base_url_v1}", "{api_key}", "{model}", "{prompt}"]})
    cfg = OperatorConfig(bucket_endpoint=s3.endpoint)
    secret = {k: v for k, v in s3.env().items() if k != "AWS_ENDPOINT_URL"}
    creds = {"bucket-credentials": secret}
    source = read_source(job.spec.tasks.harbor, secret, s3.endpoint)
    (task,) = source.tasks
    assert task.image == BASE_IMAGE and task.resources == {"cpu": 1, "memory": "512Mi"}

    # ---- the harness pod (the bundle init container's copy: Node.js alone)
    child = harness_pod(job, cfg, plan_of(job, 0, harbor=source), attempt=0, harbor=task)
    pod = child.manifest
    _, bundle_c = pod["spec"]["initContainers"]
    assert ti.BUNDLE_SOURCE_DIR in bundle_c["command"][-1]
    session, proxy_rc, proxy_out = run_task_image_pod(pod, child_kubelet(child, tmp_path / "pod", creds),
                                                      container_runtime, timeout_s=180)
    assert session.returncode == 0, session.stdout + session.stderr
    assert json.loads(session.stdout.strip().splitlines()[-1])["status"] == "completed"
    assert proxy_rc == 0 and "uploaded" in proxy_out, proxy_out
    bucket = open_bucket(f"s3://{bucket_name}/runs", **s3.bucket_options())
    prefix = "hbpath/sessions/0/"
    assert bucket.get(prefix + "artifacts/harness.stdout").decode().strip() == "answered in /app"
    assert {prefix + "artifacts/" + name for name in (ti.CHANGES, ti.DELETED)} <= {o.key for o in bucket.list(prefix)}
    patch = bucket.get(prefix + "artifacts/session.patch").decode()  # the task's /app against the image's
    assert "diff --git a/answer.txt b/answer.txt" in patch and "+42" in patch, patch

    # ---- the evaluator Job: fetch (here), verify (podman, a fresh container of the task image), report (here)
    ev = evaluator_job(job, cfg, plan_of(job, 0, harbor=source), harbor=task)
    done = run_task_image_job(ev.manifest, child_kubelet(ev, tmp_path / "eval", creds), container_runtime, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    reward = json.loads(bucket.get(prefix + "reward.json"))
    assert (reward["reward"], reward["status"], reward["evaluator"], reward["task_id"]) == (1.0, "ok", "harbor", "answer")

    # ---- the sealer Job, then what a trainer reads
    seal = sealer_job(job, cfg, 1, [plan_of(job, 0, harbor=source)])
    done = run_job_container(seal.manifest, child_kubelet(seal, tmp_path / "seal", creds), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    reader = BatchReader(open_bucket(f"s3://{bucket_name}/runs", **s3.bucket_options()), "hbpath")
    (trace,) = reader.read(reader.seqs()[-1]).traces()
    assert (trace.meta.reward, trace.meta.task_id, trace.meta.outcome) == (1.0, "answer", "ok")
    assert int(trace.loss_mask.sum()) > 0


def test_harness_env_and_the_instruction_reach_the_operator_built_task_container_byte_for_byte(
        scripted_engine, s3, container_runtime, tmp_path: Path) -> None:
    """spec.harness.env and a Harbor instruction with newlines (the session container's env, the launch request it
    writes, the task container's launcher) and task.toml's [environment].env (the task container's own env)."""
    bucket_name = s3.create_bucket()
    source = open_bucket(f"s3://{bucket_name}/tasks/env", **s3.bucket_options())
    toml = answer_task_toml() + '[environment.env]\nTASK_ENV = "from task.toml"\n'
    for rel, text in {"task.toml": toml, "instruction.md": INSTRUCTION, "tests/test.sh": ANSWER_TEST_SH}.items():
        source.put(rel, text.encode())
    job = harbor_job("hbenv", bucket_name, scripted_engine, {"command": ["node", "-e", REPORT_JS], "env": {"MULTI": MULTI}})
    cfg = OperatorConfig(bucket_endpoint=s3.endpoint)
    secret = {k: v for k, v in s3.env().items() if k != "AWS_ENDPOINT_URL"}
    source = read_source(job.spec.tasks.harbor, secret, s3.endpoint)
    (task,) = source.tasks
    child = harness_pod(job, cfg, plan_of(job, 0, harbor=source), attempt=0, harbor=task)
    session, _, proxy_out = run_task_image_pod(
        child.manifest, child_kubelet(child, tmp_path / "pod", {"bucket-credentials": secret}), container_runtime,
        timeout_s=180)
    assert session.returncode == 0, session.stdout + session.stderr + proxy_out
    bucket = open_bucket(f"s3://{bucket_name}/runs", **s3.bucket_options())
    report = json.loads(bucket.get("hbenv/sessions/0/artifacts/harness.stdout").decode().strip().splitlines()[-1])
    assert (report["multi"], report["prompt"], report["task_env"], report["proxy"]) == (
        MULTI, INSTRUCTION, "from task.toml", 200), report
