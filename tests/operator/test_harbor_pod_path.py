"""A Harbor job's session on the cluster path, every container run for real: the pods the operator builds from a
RolloutJob whose task source is an s3:// prefix on the real S3 server, the tracefleet-image containers (proxy
sidecar, session program, the evaluator's fetch and report steps) as local processes with the kubelet's mapping
(fixtures.pods), the task-image containers (the harness's launcher, the verifier) in podman with the base image, the
harness bundle's own Node.js running the agent in the task container against the proxy and the scripted engine.
What a trainer reads at the end is the session, its capture and Harbor's reward.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from fixtures.pods import Kubelet, run_job_container
from tracefleet.bucket import open_bucket
from tracefleet.contract import taskimage as ti
from tracefleet.contract.job import RolloutJob
from tracefleet.contract.semantics import session_plan
from tracefleet.operator.children.harness import harness_pod
from tracefleet.operator.children.jobs import evaluator_job, sealer_job
from tracefleet.operator.config import OperatorConfig
from tracefleet.operator.harbor_tasks import read_source
from tracefleet.runner.containers.bundle import make_bundle
from tracefleet.runner.containers.runtime import BASE_IMAGE, ContainerRuntime
from tracefleet.traces.reader import BatchReader

TASK_TOML = f"""schema_version = "1.4"
[verifier]
timeout_sec = 30
[environment]
docker_image = "{BASE_IMAGE}"
workdir = "/app"
cpus = 1
memory_mb = 512
"""
TEST_SH = """#!/bin/bash
if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
# The agent: one model call through the proxy (the bundle's node: the task image has none), its answer to a file in
# its working directory, which is the task's /app.
AGENT_JS = """(async () => {
  const [url, key, model, prompt] = process.argv.slice(1);
  const r = await fetch(url + "/chat/completions", {method: "POST", headers: {"content-type": "application/json",
    authorization: "Bearer " + key}, body: JSON.stringify({model, messages: [{role: "user", content: prompt}]})});
  const answer = (await r.json()).choices[0].message.content.trim();
  require("fs").writeFileSync("answer.txt", answer + "\\n");
  console.log("answered in " + process.cwd());
})().catch((e) => { console.error(e); process.exit(1); });"""


def _podman(runtime: ContainerRuntime, container: dict, mounts: dict[str, Path], *extra: str) -> list[str]:
    """`podman run` of a task-image container as the kubelet would start it (its volumes at their paths)."""
    args = ["run", "--rm", "--network", "host", *extra]
    for mount in container.get("volumeMounts", []):
        args += ["-v", f"{mounts[mount['name']]}:{mount['mountPath']}"]
    for item in container.get("env", []):
        args += ["-e", f"{item['name']}={item['value']}"]
    return runtime.command(*args, container["image"], *container["command"])


def test_harbor_session_runs_in_its_task_image_and_is_judged_by_its_tests(scripted_engine, s3, container_runtime,
                                                                          tmp_path: Path) -> None:
    scripted_engine.configure(no_tools_text="42")
    bucket_name = s3.create_bucket()
    source = open_bucket(f"s3://{bucket_name}/tasks/answer", **s3.bucket_options())
    for rel, text in {"task.toml": TASK_TOML, "instruction.md": "Write the answer to answer.txt.\n",
                      "tests/test.sh": TEST_SH}.items():
        source.put(rel, text.encode())
    job = RolloutJob.model_validate({
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob",
        "metadata": {"name": "hbpath", "namespace": "default", "uid": "0c1d2e3f-hbpath"},
        "spec": {
            "inference": {"external": {"baseUrl": scripted_engine.url, "model": scripted_engine.model},
                          "capture": {"mode": "server"}},
            "harness": {"preset": "command", "image": "reg.local/bundle:1", "sessionTimeoutSeconds": 120,
                        "command": ["node", "-e", AGENT_JS, "{base_url_v1}", "{api_key}", "{model}", "{prompt}"]},
            "tasks": {"harbor": {"uri": f"s3://{bucket_name}/tasks"}},
            "output": {"uri": f"s3://{bucket_name}/runs", "credentialsSecretRef": {"name": "bucket-credentials"},
                       "tracesPerBatch": 1},
        },
    })
    cfg = OperatorConfig(bucket_endpoint=s3.endpoint)
    secret = {k: v for k, v in s3.env().items() if k != "AWS_ENDPOINT_URL"}
    creds = {"bucket-credentials": secret}
    (task,) = read_source(job.spec.tasks.harbor, secret, s3.endpoint).tasks
    assert task.image == BASE_IMAGE and task.resources == {"cpu": 1, "memory": "512Mi"}

    # ---- the harness pod
    pod = harness_pod(job, cfg, session=0, attempt=0, harbor=task)
    kubelet = Kubelet(tmp_path / "pod", creds, pod["spec"]["volumes"])
    proxy_c, bundle_c = pod["spec"]["initContainers"]
    harness_c, session_c = pod["spec"]["containers"]
    volumes = {v["name"]: kubelet.root / v["name"] for v in pod["spec"]["volumes"]}
    # the bundle init container: what `cp` leaves in the shared volume from the bundle image (here: Node.js alone)
    assert ti.BUNDLE_SOURCE_DIR in bundle_c["command"][-1]
    make_bundle(volumes[ti.SHARED_VOLUME] / "bundle", {}, link=True)
    argv, env, cwd = kubelet.process(proxy_c)
    proxy = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    _, session_env, _ = kubelet.process(session_c)
    home = Path(session_env["HOME"])  # the session program's HOME path, the same volume in the task container
    task_container = subprocess.Popen(
        _podman(container_runtime, harness_c, {**volumes, "home": home}, "-v", f"{home}:{home}"),
        env={**os.environ, **container_runtime.env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        argv, env, cwd = kubelet.process(session_c)
        session = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=180)
        task_container.wait(timeout=60)
        os.killpg(proxy.pid, signal.SIGTERM)
        proxy_out, _ = proxy.communicate(timeout=60)
    finally:
        for proc in (task_container, proxy):
            if proc.poll() is None:
                proc.kill()
    assert session.returncode == 0, session.stdout + session.stderr
    assert json.loads(session.stdout.strip().splitlines()[-1])["status"] == "completed"
    assert proxy.returncode == 0 and "uploaded" in proxy_out, proxy_out
    bucket = open_bucket(f"s3://{bucket_name}/runs", **s3.bucket_options())
    prefix = "hbpath/sessions/0/"
    assert bucket.get(prefix + "artifacts/harness.stdout").decode().strip() == "answered in /app"
    assert {prefix + "artifacts/" + name for name in (ti.CHANGES, ti.DELETED)} <= {o.key for o in bucket.list(prefix)}

    # ---- the evaluator Job: fetch (here), verify (podman, a fresh container of the task image), report (here)
    ev = evaluator_job(job, cfg, 0, harbor=task)
    spec = ev["spec"]["template"]["spec"]
    fetch_c, verify_c = spec["initContainers"]
    ek = Kubelet(tmp_path / "eval", creds, spec["volumes"])
    done = run_job_container({"spec": {"template": {"spec": {"containers": [fetch_c]}}}}, ek, tmp_path)
    assert done.returncode == 0 and json.loads(done.stdout)["fetched"], done.stdout + done.stderr
    container_runtime.run(*_podman(container_runtime, verify_c, {v["name"]: ek.root / v["name"] for v in spec["volumes"]}
                                   )[len(container_runtime.argv):], timeout=120)
    done = run_job_container(ev, ek, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    reward = json.loads(bucket.get(prefix + "reward.json"))
    assert (reward["reward"], reward["status"], reward["evaluator"], reward["task_id"]) == (1.0, "ok", "harbor", "answer")

    # ---- the sealer Job, then what a trainer reads
    done = run_job_container(sealer_job(job, cfg, 1, session_plan(job.name, ["answer"], 1)),
                             Kubelet(tmp_path / "seal", creds, []), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    reader = BatchReader(open_bucket(f"s3://{bucket_name}/runs", **s3.bucket_options()), "hbpath")
    (trace,) = reader.read(reader.seqs()[-1]).traces()
    assert (trace.meta.reward, trace.meta.task_id, trace.meta.outcome) == (1.0, "answer", "ok")
    assert int(trace.loss_mask.sum()) > 0
