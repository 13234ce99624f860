"""The pods a RolloutJob becomes: on the real node (tests/fixtures/node.py) where they run as pods, and their programs
run as plain processes (tests/fixtures/pod_programs.py) given what the operator writes for them (the variables and
plan files of the children `operator/children/` builds, read as fixtures.pod_reads does), for what the programs do
with the checkout's files (the quickstart agent and its calc task, in no image). Real parts: the scripted engine, the
S3 server, the quickstart agent (`command` preset) and its task's tests.

The programs: the proxy sidecar (`tracefleet proxy --in-pod`) + the session program (`tracefleet run --in-pod`) →
SIGTERM the sidecar → capture + artifacts in S3 → the evaluator program (`tests` preset) writes reward.json → the
sealer program seals a batch → trace reader; the same at the schema's maxima; the sidecar program with a client
that hangs up. On the node: the evaluator Job of a session that uploaded nothing, and the sidecar's exact capture with
the tokenizer from its mounted cache (a harness pod end to end, a failed harness's included, is the
driver-conformance test's).
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from fixtures.plans import plan_of
from tracefleet.contract.job import Capture, RolloutJob
from tracefleet.bucket import open_bucket
from tracefleet.contract.capture import read_capture_log
from tracefleet.operator.children.harness import harness_pod, session_secret, sidecar_plan
from tracefleet.operator.children.jobs import evaluator_job, sealer_job
from tracefleet.contract.podenv import EVALUATOR_FATAL_EXIT_CODE, EvaluatorEnv, ProxySidecarEnv, SealerEnv
from tracefleet.operator.config import OperatorConfig
from tracefleet.operator.plans import job_plans, job_tasks
from tracefleet.proxy.upload import upload_outputs
from tracefleet.traces.reader import BatchReader

from fixtures.abandoning_client import abandon, request_bytes
from fixtures.hub_cache import write_hub_model
from fixtures.node_jobs import NAMESPACE, TRACEFLEET_IMAGE, Installed, pod_report
from fixtures.pod_programs import run_job_program, run_session_pair, start_sidecar
from fixtures.pod_reads import child_reads

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart"
# The bug-fix task the quickstart used to ship (its folder stays in examples/quickstart/tasks/calc).
CALC_TASK = {
    "id": "calc-add",
    "prompt": "add(a, b) in calc.py returns the wrong result. Fix it so the tests pass.",
    "workspace": {"repo": str(QUICKSTART / "tasks" / "calc")},  # the path the task has in the image
    "failToPass": ["test_calc.py::test_add"],
    "passToPass": ["test_calc.py::test_mul"],
    "metadata": {"protected": ["test_calc.py"]},
}
FIXED_CALC = "```python\ndef add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n```"


def rollout_job(engine: Any, bucket_uri: str, samples: int = 1) -> RolloutJob:
    calc = copy.deepcopy(CALC_TASK)
    manifest = {
        "apiVersion": "tracefleet.io/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": "podpath", "namespace": "default", "uid": "0c1d2e3f-podpath"},
        "spec": {
            "inference": {"external": {"baseUrl": engine.url, "model": engine.model}, "capture": {"mode": "server"}},
            "harness": {
                "preset": "command",
                "image": "ghcr.io/tracefleet/tracefleet:test",
                "command": ["python", str(QUICKSTART / "agent.py"), "{prompt}"],
                "env": {"AGENT_MAX_TURNS": "1", "AGENT_MAX_TOKENS": "256"},
                "workspace": {"setup": ["echo prepared > SETUP_DONE"]},
                "sessionTimeoutSeconds": 180,
            },
            "tasks": {"inline": [calc], "samplesPerTask": samples},
            "evaluator": {"preset": "tests", "timeoutSeconds": 120},
            "output": {"uri": bucket_uri, "credentialsSecretRef": {"name": "bucket-credentials"}, "tracesPerBatch": 1},
        },
    }
    return RolloutJob.model_validate(manifest)


def test_pod_programs_run_a_session_end_to_end(scripted_engine, s3, tmp_path: Path) -> None:
    """The harness pod's programs, then the evaluator's and the sealer's, each given what the operator writes for
    its container, up to the batch a trainer reads."""
    scripted_engine.configure(no_tools_text=FIXED_CALC)
    bucket_uri = f"s3://{s3.create_bucket()}/runs"
    job = rollout_job(scripted_engine, bucket_uri)
    cfg = OperatorConfig(bucket_endpoint=s3.endpoint)
    creds = {k: v for k, v in s3.env().items() if k != "AWS_ENDPOINT_URL"}  # the endpoint is the operator's
    bucket = open_bucket(bucket_uri, **s3.bucket_options())

    # ---- the harness pod's programs: the proxy sidecar (native, starts first), then the session program
    child = harness_pod(job, cfg, plan_of(job, 0), attempt=0)
    (proxy_c,) = child.manifest["spec"]["initContainers"]
    (harness_c,) = child.manifest["spec"]["containers"]
    assert proxy_c["restartPolicy"] == "Always" and harness_c["command"] == ["tracefleet", "run", "--in-pod"]
    # the bucket's credentials reach the sidecar only
    assert [e["secretRef"]["name"] for e in proxy_c["envFrom"]] == ["bucket-credentials"] and "envFrom" not in harness_c
    harness, proxy_rc, out = run_session_pair(job, cfg, plan_of(job, 0), tmp_path, creds)
    assert harness.returncode == 0, harness.stdout + harness.stderr
    summary = json.loads(harness.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["patch_bytes"] > 0
    assert proxy_rc == 0, out
    assert "uploaded" in out

    prefix = "podpath/sessions/0/"
    keys = {o.key for o in bucket.list(prefix)}
    assert {prefix + k for k in ("capture.jsonl", "upload.json", "artifacts/session.patch", "artifacts/result.json",
                                 "artifacts/harness.stdout", "artifacts/exit_code")} <= keys, keys
    capture = tmp_path / "capture.jsonl"
    capture.write_bytes(bucket.get(prefix + "capture.jsonl"))
    log = read_capture_log(capture)
    assert len(log.records) == 1 and not log.torn_tail
    rec = log.records[0]
    assert rec.status == "ok" and rec.completion_ids and len(rec.logprobs) == len(rec.completion_ids)
    assert rec.session_id == "podpath-s0"
    patch = bucket.get(prefix + "artifacts/session.patch").decode()
    assert "+    return a + b" in patch and "-    return a - b" in patch
    # spec.harness.workspace.setup ran in the pod before the harness, into the base the patch is taken from
    assert "$ echo prepared > SETUP_DONE" in bucket.get(prefix + "artifacts/setup.log").decode()
    assert "SETUP_DONE" not in patch
    result = json.loads(bucket.get(prefix + "artifacts/result.json"))
    assert result["status"] == "completed" and result["harness_exit_code"] == 0 and result["task_id"] == "calc-add"
    manifest = json.loads(bucket.get(prefix + "upload.json"))
    assert manifest["objects"]["capture.jsonl"]["bytes"] == capture.stat().st_size

    # ---- the evaluator Job (tests preset: FAIL_TO_PASS / PASS_TO_PASS on a fresh patched copy)
    ev = evaluator_job(job, cfg, plan_of(job, 0))
    done = run_job_program("evaluate", child_reads(EvaluatorEnv, ev, "evaluator", tmp_path / "eval"), tmp_path / "eval",
                           creds)
    assert done.returncode == 0, done.stdout + done.stderr
    reward = json.loads(bucket.get(prefix + "reward.json"))
    assert reward["status"] == "ok" and reward["reward"] == 1.0, reward
    assert reward["details"]["fail_to_pass"] == {"test_calc.py::test_add": True}
    assert reward["details"]["pass_to_pass"] == {"test_calc.py::test_mul": True}
    assert reward["task_id"] == "calc-add" and reward["sample_index"] == 0

    # ---- the sealer Job, then what a trainer reads
    seal = sealer_job(job, cfg, 1, [plan_of(job, 0)])
    done = run_job_program("seal", child_reads(SealerEnv, seal, "sealer", tmp_path / "seal"), tmp_path / "seal", creds)
    assert done.returncode == 0, done.stdout + done.stderr
    sealed = json.loads(done.stdout.strip().splitlines()[-1])
    assert sealed["batch_id"] == "k8s-000001" and sealed["traces"] == 1
    reader = BatchReader(open_bucket(bucket_uri, **s3.bucket_options()), "podpath")
    batch = reader.read(reader.seqs()[-1])
    (trace,) = batch.traces()
    trainable = int(trace.loss_mask.sum())
    assert trainable == len(rec.completion_ids) > 0
    assert list(trace.tokens[trace.loss_mask == 1]) == list(rec.completion_ids)
    assert trace.meta.reward == 1.0
    assert (trace.meta.group_id, trace.meta.task_id, trace.meta.sample_index) == ("podpath/calc-add", "calc-add", 0)
    assert (trace.meta.harness, trace.meta.outcome) == ("command", "ok")


def test_evaluator_fails_closed_on_the_node_when_the_harness_uploaded_nothing(node, installed: Installed, cluster_s3,
                                                                            host_engine) -> None:
    """The evaluator Job the operator builds, run by the kubelet of the real node (its plan's ConfigMaps and the
    Job applied as they are, without the RolloutJob that would own them), for a session that uploaded nothing."""
    output = f"s3://{installed.bucket}/podpath-{uuid.uuid4().hex[:8]}/runs"
    job = rollout_job(host_engine, output)
    job.spec.harness.image = TRACEFLEET_IMAGE  # the evaluator's too (the job names no evaluator image)
    ev = evaluator_job(job, OperatorConfig(), plan_of(job, 0))
    name = ev.manifest["metadata"]["name"]
    apply_child(node, ev)
    try:
        deadline = time.monotonic() + 180
        while True:
            pods = installed.core.list_namespaced_pod(NAMESPACE, label_selector=f"job-name={name}").items
            states = [s.state.terminated for p in pods for s in p.status.container_statuses or [] if s.state.terminated]
            if states or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert [s.exit_code for s in states][:1] == [EVALUATOR_FATAL_EXIT_CODE], pod_report(node.kube, installed.pods)
        reward = json.loads(open_bucket(output, **cluster_s3.bucket_options()).get("podpath/sessions/0/reward.json"))
        # storage, not the agent: the infrastructure's (left out of training), and final (nothing to judge again)
        assert reward["reward"] == 0.0 and reward["status"] == "unavailable" and "session.patch" in reward["message"]
    finally:
        node.kube.kubectl("-n", NAMESPACE, "delete", "job", name, "--cascade=background", "--wait=false")
        for cm in ev.config_maps:
            node.kube.kubectl("-n", NAMESPACE, "delete", "configmap", cm["metadata"]["name"], "--wait=false")


def test_upload_is_idempotent_skips_links_and_keeps_files_on_failure(s3, tmp_path: Path, monkeypatch) -> None:
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    capture_dir, artifacts = tmp_path / "capture", tmp_path / "artifacts"
    (artifacts / "logs").mkdir(parents=True)
    capture_dir.mkdir()
    (capture_dir / "s1.jsonl").write_text('{"x": 1}\n')
    (artifacts / "session.patch").write_text("diff\n")
    (artifacts / "logs" / "harness.stdout").write_text("hello\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("do not upload")
    (artifacts / "leak").symlink_to(secret)
    (artifacts / "leakdir").symlink_to(tmp_path / "capture", target_is_directory=True)
    prefix = f"s3://{s3.create_bucket()}/j/sessions/7/"
    first = upload_outputs(prefix, capture_dir, ["s1"], artifacts)
    again = upload_outputs(prefix, capture_dir, ["s1"], artifacts)
    assert first.ok and again.ok and first.uploaded == again.uploaded
    assert set(first.uploaded) == {"capture.jsonl", "artifacts/session.patch", "artifacts/logs/harness.stdout"}
    assert sorted(Path(p).name for p in first.skipped) == ["leak", "leakdir"]
    bucket = open_bucket(prefix.rstrip("/"), **s3.bucket_options())
    assert sorted(o.key for o in bucket.list()) == sorted([*first.uploaded, "upload.json"])
    assert bucket.get("capture.jsonl") == b'{"x": 1}\n'

    # a session without calls still gets an (empty) capture.jsonl; refused credentials are an error, files stay
    assert upload_outputs(str(tmp_path / "local-bucket"), capture_dir, ["s2"], None).uploaded["capture.jsonl"]["bytes"] == 0
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + s3.secret_key)
    failed = upload_outputs(prefix, capture_dir, ["s1"], artifacts)
    assert not failed.ok and "capture.jsonl" in (failed.error or "") and "denied" in (failed.error or ""), failed.error
    assert (capture_dir / "s1.jsonl").exists() and (artifacts / "session.patch").exists()


def test_kwok_finishes_annotated_harness_pods_with_their_sidecar(kube, scripted_engine, tmp_path: Path) -> None:
    """hack/controlplane/kwok-stages.yaml: a harness pod as the operator builds it, annotated with
    tracefleet.io/kwok-delay, stays Running that long, then finishes (Succeeded, or Failed with the
    annotated exit code) and its native proxy sidecar is stopped with it."""
    from kubernetes import client

    ns = f"podpath-{uuid.uuid4().hex[:6]}"
    assert kube.kubectl("create", "namespace", ns).returncode == 0
    core = client.CoreV1Api(kube.api_client())
    job = rollout_job(scripted_engine, "s3://kwok-bucket/runs", samples=2)
    try:
        for session, annotations in ((0, {"tracefleet.io/kwok-delay": "2s"}),
                                     (1, {"tracefleet.io/kwok-delay": "0s", "tracefleet.io/kwok-outcome": "failed",
                                          "tracefleet.io/kwok-exit-code": "124"})):
            pod = harness_pod(job, OperatorConfig(), plan_of(job, session), attempt=0).manifest
            pod["metadata"].update(namespace=ns, annotations=annotations)
            pod["metadata"].pop("ownerReferences")  # no RolloutJob here: the garbage collector would take it
            r = kube.kubectl("apply", "-f", "-", input=json.dumps(pod))
            assert r.returncode == 0, r.stderr
        started = time.monotonic()
        name0 = harness_pod(job, OperatorConfig(), plan_of(job, 0), 0).manifest["metadata"]["name"]
        name1 = harness_pod(job, OperatorConfig(), plan_of(job, 1), 0).manifest["metadata"]["name"]
        seen_running = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            phases = {p.metadata.name: p.status.phase for p in core.list_namespaced_pod(ns).items}
            seen_running |= phases.get(name0) == "Running"
            if phases.get(name0) == "Succeeded" and phases.get(name1) == "Failed":
                break
            time.sleep(0.3)
        assert phases == {name0: "Succeeded", name1: "Failed"}, phases
        assert seen_running and time.monotonic() - started > 1.5
        ok, failed = core.read_namespaced_pod(name0, ns), core.read_namespaced_pod(name1, ns)
        assert ok.status.container_statuses[0].state.terminated.exit_code == 0
        assert failed.status.container_statuses[0].state.terminated.exit_code == 124
        for p in (ok, failed):
            (sidecar,) = p.status.init_container_statuses
            assert sidecar.name == "proxy" and sidecar.state.terminated is not None
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_plans_at_the_schemas_maxima_reach_their_programs(scripted_engine, tmp_path: Path) -> None:
    """A prompt of the schema's most characters (262,144, each 4 UTF-8 bytes: its plan is over 1 MiB) and a group of
    its most samples per task (1,024, sealed in one batch): the harness pod, the evaluator Job and the sealer Job each
    start and read their plans (files from ConfigMaps), where one environment variable over 128 KiB kept the process
    from starting at all."""
    prompt = "\U0001F600" * 262144
    job = rollout_job(scripted_engine, str(tmp_path / "bucket"), samples=1024)
    job.spec.tasks.inline[0].prompt = prompt
    plans = job_plans(job, job_tasks(job))
    plan = plans[1023]
    assert len(harness_pod(job, OperatorConfig(), plan, attempt=0).config_maps) > 1  # over a ConfigMap's 1 MiB: split
    harness, proxy_rc, out = run_session_pair(job, OperatorConfig(), plan, tmp_path)
    assert proxy_rc == 0 and "uploaded" in out, out
    # the session program ran its planned session (whether a harness takes a prompt this long is the harness's: the
    # command preset passes it as TRACEFLEET_PROMPT, one variable, as `tracefleet run` does)
    session = tmp_path / "bucket" / "podpath" / "sessions" / "1023"
    result = json.loads((session / "artifacts" / "result.json").read_text())
    assert (result["session_id"], result["task_id"]) == ("podpath-s1023", "calc-add"), harness.stdout + harness.stderr

    ev = evaluator_job(job, OperatorConfig(), plan)
    done = run_job_program("evaluate", child_reads(EvaluatorEnv, ev, "evaluator", tmp_path / "eval"), tmp_path / "eval")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((session / "reward.json").read_text())["task_id"] == "calc-add"

    seal = sealer_job(job, OperatorConfig(), 1, plans)
    done = run_job_program("seal", child_reads(SealerEnv, seal, "sealer", tmp_path / "seal"), tmp_path / "seal")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["traces"] == 1024


# One model call through the session's proxy (argv: its v1 URL, key, model), the answer to stdout.
ONE_CALL = """
import json, sys, urllib.request
url, key, model = sys.argv[1:4]
req = urllib.request.Request(url + "/chat/completions", headers={"Authorization": "Bearer " + key,
    "Content-Type": "application/json"}, data=json.dumps({"model": model, "max_tokens": 64,
    "messages": [{"role": "user", "content": "fix add"}]}).encode())
print(json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["message"]["content"])
"""


def apply_child(node, child) -> None:  # noqa: ANN001 - the fixture's, and a plan_volume.Child
    """A pod or Job as the operator builds it, with its plan's ConfigMaps, in the chart's namespace on the node,
    without the RolloutJob that would own them (the garbage collector would take them)."""
    for obj in [*child.config_maps, child.manifest]:
        obj["metadata"].pop("ownerReferences")
        obj["metadata"]["namespace"] = NAMESPACE
        r = node.kube.kubectl("apply", "-f", "-", input=json.dumps(obj))
        assert r.returncode == 0, r.stderr


def test_sidecar_renders_exactly_with_the_tokenizer_from_its_mounted_cache_on_the_node(
        node, installed: Installed, cluster_s3, host_engine, tmp_path: Path) -> None:
    """The default capture mode (auto) in a harness pod on the real node: the sidecar resolves the job's hub model id
    in the claim the operator mounts read-only (a PersistentVolume on the node's disk, laid out as vLLM leaves it),
    offline, and captures in exact mode."""
    host_engine.configure(no_tools_text=FIXED_CALC)
    run = uuid.uuid4().hex[:8]
    output = f"s3://{installed.bucket}/podpath-{run}/runs"
    job = rollout_job(host_engine, output)
    job.spec.harness.image = TRACEFLEET_IMAGE
    job.spec.harness.command = ["python", "-c", ONE_CALL, "{base_url_v1}", "{api_key}", "{model}"]
    job.spec.tasks.inline[0].workspace = None  # the checkout's calc folder is not in the image
    job.spec.inference.capture = Capture.model_validate(
        {"tokenizer": "acme/tiny-chat", "tokenizerCache": {"claimName": f"tok-{run}", "mountPath": "/models"}})
    assert job.spec.inference.capture.mode == "auto"
    cache = tmp_path / "tokenizer-cache"
    write_hub_model(cache, "acme/tiny-chat")  # what the claim holds
    volume = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"tok-{run}"},
              "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                       "hostPath": {"path": str(cache), "type": "Directory"},
                       "claimRef": {"namespace": NAMESPACE, "name": f"tok-{run}"}}}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": f"tok-{run}", "namespace": NAMESPACE},
             "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": f"tok-{run}",
                      "resources": {"requests": {"storage": "1Gi"}}}}
    child = harness_pod(job, OperatorConfig(), plan_of(job, 0), attempt=0)
    name = child.manifest["metadata"]["name"]
    try:
        for obj in (volume, claim):
            assert node.kube.kubectl("apply", "-f", "-", input=json.dumps(obj)).returncode == 0
        apply_child(node, child)
        deadline = time.monotonic() + 180
        while installed.pods.phases.get(name, [""])[-1] not in ("Succeeded", "Failed") and time.monotonic() < deadline:
            time.sleep(1)
        proxy_log = node.kube.kubectl("-n", NAMESPACE, "logs", name, "-c", "proxy").stdout
        assert installed.pods.phases.get(name, [""])[-1] == "Succeeded", pod_report(node.kube, installed.pods)
        assert "capture mode exact" in proxy_log, proxy_log
        capture = tmp_path / "capture.jsonl"
        capture.write_bytes(open_bucket(output, **cluster_s3.bucket_options()).get("podpath/sessions/0/capture.jsonl"))
        (rec,) = read_capture_log(capture).records
        assert rec.status == "ok" and rec.mode == "exact" and rec.splice is not None
        assert rec.splice.new_root_reason == "new_conversation" and rec.completion_ids
    finally:
        host_engine.reset()
        node.kube.kubectl("-n", NAMESPACE, "delete", "pod", name, "--wait=false")
        node.kube.kubectl("-n", NAMESPACE, "delete", "pvc", f"tok-{run}", "--wait=false")
        node.kube.kubectl("delete", "pv", f"tok-{run}", "--wait=false")
        for cm in child.config_maps:
            node.kube.kubectl("-n", NAMESPACE, "delete", "configmap", cm["metadata"]["name"], "--wait=false")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_sidecar_program_records_and_cancels_a_call_its_harness_abandons(scripted_engine, tmp_path: Path,
                                                                         stream: bool) -> None:
    """The sidecar program (`tracefleet proxy --in-pod`, a plain process here) given the plan and secret the operator
    writes for a harness pod's sidecar, its folders this test's: a client that hangs up mid-generation (a harness's
    own client timeout) gets its call recorded (`client_disconnect`) within a second, the engine stops generating it
    at once, and the record reaches the bucket when the program is stopped as a pod's sidecar is (SIGTERM)."""
    scripted_engine.configure(token_delay_s=0.02, no_tools_text=" ".join(f"word{i}" for i in range(2000)))
    job = rollout_job(scripted_engine, str(tmp_path / "bucket"))
    sidecar_env = ProxySidecarEnv(plan=sidecar_plan(job, plan_of(job, 0)), session_secret=session_secret())
    session_id, secret = sidecar_env.plan.session_id, sidecar_env.session_secret
    sidecar = start_sidecar(sidecar_env, tmp_path / "sidecar", tmp_path / "artifacts")
    capture = sidecar.capture_dir / f"{session_id}.jsonl"
    try:
        port = sidecar.port
        hung_up = abandon("127.0.0.1", port, request_bytes("openai-chat", stream, secret), stream, hold_s=10,
                          ready=lambda: scripted_engine.running() == 1 and time.sleep(0.3) is None)
        assert wait_until(lambda: capture.exists() and read_capture_log(capture).records, 1.0), \
            f"no record within a second of the hang-up ({time.time() - hung_up:.2f}s)"
        (rec,) = read_capture_log(capture).records
        assert rec.error is not None and rec.error.kind == "client_disconnect" and rec.stream == stream, rec
        assert wait_until(lambda: scripted_engine.running() == 0, 5.0), "the engine request is still running"
    finally:
        returncode, out = sidecar.stop()  # the harness is gone
    assert returncode == 0, out
    (uploaded,) = read_capture_log(tmp_path / "bucket" / "podpath" / "sessions" / "0" / "capture.jsonl").records
    assert uploaded.call_id == rec.call_id and uploaded.error.kind == "client_disconnect"


def wait_until(check: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return value
