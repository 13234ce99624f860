"""Child manifests built from real RolloutJob manifests (the shared pydantic model), checked field by field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from tracefleet.operator.children.harness import PROXY_PORT, SESSION_DEADLINE_GRACE_S, exact_mode_problem, harness_pod
from tracefleet.operator.children.inference import (ENGINE_PORT, VLLM_LOOPBACK_PORT, extra_args_problem, inference_deployment,
                                                   inference_service)
from tracefleet.operator.children.jobs import evaluator_job, sealer_job
from tracefleet.operator.children.network_policy import batch_network_policy, harness_network_policy, job_reach
from tracefleet.operator import names as n
from tracefleet.contract import podenv
from tracefleet.api import DEFAULT_VLLM_IMAGE
from fixtures.plans import plan_of
from fixtures.pod_reads import child_reads
from tracefleet.contract.podenv import EvaluatorEnv, HarnessEnv, ProxySidecarEnv
from tracefleet.contract.proxy_plan import ProxyPlan
from tracefleet.vllm import vllm_server
from tracefleet.contract.job import RolloutJob
from tracefleet.operator.config import OperatorConfig

MANAGED = textwrap.dedent(
    """
    apiVersion: tracefleet.io/v1alpha1
    kind: RolloutJob
    metadata:
      name: demo
      namespace: team
      uid: 0b7d2c1e-uid
      generation: 1
      labels: {kueue.x-k8s.io/queue-name: gpu-queue, unrelated: x}
    spec:
      inference:
        managed:
          model: Qwen/Qwen3-4B
          servedModelName: qwen
          tensorParallelSize: 2
          modelCache: {claimName: models}
          extraArgs: ["--max-model-len", "32768"]
      harness: {preset: codex, image: ghcr.io/acme/codex:1, runtimeClassName: gvisor, sessionTimeoutSeconds: 600}
      tasks:
        inline: [{id: t1, prompt: "fix the bug"}, {id: t2, prompt: "add a test"}]
        samplesPerTask: 4
      evaluator: {preset: tests, image: ghcr.io/acme/eval:1, timeoutSeconds: 300}
      output: {uri: "s3://traces/runs", credentialsSecretRef: {name: bucket-creds}, tracesPerBatch: 4}
      parallelism: 3
    """
)

def external_body() -> dict:
    body = yaml.safe_load(MANAGED)
    body["spec"]["inference"] = {"external": {"baseUrl": "http://10.1.2.3:8000", "model": "qwen"}}
    return body


@pytest.fixture
def job() -> RolloutJob:
    return RolloutJob.model_validate(yaml.safe_load(MANAGED))


CFG = OperatorConfig(proxy_image="reg/tracefleet:test", evaluator_image="reg/tracefleet:test")


def _owner_ok(m: dict, job: RolloutJob) -> None:
    (ref,) = m["metadata"]["ownerReferences"]
    assert ref == {
        "apiVersion": "tracefleet.io/v1alpha1",
        "kind": "RolloutJob",
        "name": "demo",
        "uid": job.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    labels = m["metadata"]["labels"]
    assert labels[n.LABEL_JOB] == "demo"
    assert labels["kueue.x-k8s.io/queue-name"] == "gpu-queue"  # Kueue label propagated
    assert "unrelated" not in labels


def test_inference_deployment_has_gpus_probes_shm_and_cache(job: RolloutJob) -> None:
    d = inference_deployment(job, CFG)
    _owner_ok(d, job)
    pod = d["spec"]["template"]["spec"]
    ctr, gate = pod["containers"]
    assert ctr["image"].startswith("vllm/vllm-openai")
    # vLLM on loopback; the gate (the tracefleet image) on the pod's port, in front of it
    assert "ports" not in ctr and gate["ports"] == [{"name": "http", "containerPort": ENGINE_PORT}]
    assert gate["image"] == CFG.proxy_image and gate["args"][:1] == ["engine-gate"]
    assert gate["args"][gate["args"].index("--engine") + 1] == f"http://127.0.0.1:{VLLM_LOOPBACK_PORT}"
    assert ctr["resources"]["limits"]["nvidia.com/gpu"] == "2"  # defaults to tensorParallelSize
    args = ctr["args"]
    assert args[args.index("--served-model-name") + 1] == "qwen"
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert args[args.index("--model") + 1] == "Qwen/Qwen3-4B"
    assert args[-2:] == ["--max-model-len", "32768"]
    # the one command line the tests run real vLLM with: tools and reasoning parsed for Qwen3, dev mode on
    assert args == vllm_server(job.spec.inference, host="127.0.0.1", port=VLLM_LOOPBACK_PORT).args
    assert "--enable-auto-tool-choice" in args and args[args.index("--tool-call-parser") + 1] == "hermes"
    assert args[args.index("--reasoning-parser") + 1] == "qwen3" and "--enable-prompt-tokens-details" in args
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in ctr["env"]
    assert ctr["image"] == DEFAULT_VLLM_IMAGE
    # /health answers without the API key (/v1/models does not), through the gate
    assert ctr["startupProbe"]["httpGet"] == {"path": "/health", "port": ENGINE_PORT}
    # 10-15 minutes for download + load before liveness may kill it
    assert 600 <= ctr["startupProbe"]["periodSeconds"] * ctr["startupProbe"]["failureThreshold"] <= 900
    assert ctr["readinessProbe"]["httpGet"]["path"] == "/health"
    assert ctr["livenessProbe"]["httpGet"]["path"] == "/health"
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["dshm"]["emptyDir"]["medium"] == "Memory"
    assert vols["model-cache"]["persistentVolumeClaim"]["claimName"] == "models"
    mounts = {m["name"]: m["mountPath"] for m in ctr["volumeMounts"]}
    assert mounts["dshm"] == "/dev/shm"
    assert d["spec"]["selector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    svc = inference_service(job)
    _owner_ok(svc, job)
    assert svc["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["port"] == ENGINE_PORT
    assert "sessionAffinity" not in svc["spec"]  # one replica


def test_extra_args_cannot_move_vllm_off_the_loopback_behind_the_gate(job: RolloutJob) -> None:
    assert extra_args_problem(job) is None
    body = yaml.safe_load(MANAGED)
    body["spec"]["inference"]["managed"]["extraArgs"] = ["--host", "0.0.0.0", "--port=8000", "--max-model-len", "8"]
    problem = extra_args_problem(RolloutJob.model_validate(body))
    assert problem is not None and "--host, --port are the operator's" in problem, problem


def test_inference_service_keeps_a_session_on_one_replica_when_there_are_several() -> None:
    body = yaml.safe_load(MANAGED)
    body["spec"]["inference"]["managed"]["replicas"] = 3
    assert inference_service(RolloutJob.model_validate(body))["spec"]["sessionAffinity"] == "ClientIP"


@pytest.mark.parametrize("kind", ["managed", "external"])
def test_engine_api_key_reaches_vllm_and_the_proxy_sidecar_from_the_secret(kind: str) -> None:
    body = yaml.safe_load(MANAGED) if kind == "managed" else external_body()
    body["spec"]["inference"][kind]["apiKeySecretRef"] = {"name": "engine-key", "key": "token"}
    job = RolloutJob.model_validate(body)
    from_secret = {"secretKeyRef": {"name": "engine-key", "key": "token"}}
    pod = harness_pod(job, CFG, plan_of(job, 0), attempt=1, secret="tfs_secret").manifest
    proxy = pod["spec"]["initContainers"][0]
    assert {"name": podenv.ENGINE_API_KEY, "valueFrom": from_secret} in proxy["env"]
    harness = pod["spec"]["containers"][0]
    assert not any(e["name"] == podenv.ENGINE_API_KEY for e in harness.get("env", []))  # only the sidecar
    if kind == "managed":
        vllm, gate = inference_deployment(job, CFG)["spec"]["template"]["spec"]["containers"]
        assert {"name": "VLLM_API_KEY", "valueFrom": from_secret} in vllm["env"]
        assert gate["env"] == [{"name": podenv.ENGINE_API_KEY, "valueFrom": from_secret}]


def test_harness_pod_is_sandboxed_with_native_proxy_sidecar(job: RolloutJob, tmp_path) -> None:
    child = harness_pod(job, CFG, plan_of(job, 5), attempt=1, secret="tfs_secret")
    pod = child.manifest
    _owner_ok(pod, job)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "demo-s5-a1"
    labels = meta["labels"]
    assert (labels[n.LABEL_SESSION], labels[n.LABEL_TASK], labels[n.LABEL_SAMPLE], labels[n.LABEL_ATTEMPT]) == ("5", "1", "1", "1")
    assert labels[n.LABEL_COMPONENT] == "harness"
    assert spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["activeDeadlineSeconds"] == 600 + SESSION_DEADLINE_GRACE_S
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    (proxy,) = spec["initContainers"]
    assert proxy["name"] == "proxy" and proxy["restartPolicy"] == "Always"  # native sidecar
    assert proxy["image"] == "reg/tracefleet:test"
    assert proxy["startupProbe"]["httpGet"]["path"] == "/health"
    sidecar = child_reads(ProxySidecarEnv, child, "proxy", tmp_path / "proxy")
    assert sidecar.plan.proxy.engine_url == "http://demo-inference.team.svc:8000"
    assert sidecar.plan.upload_to == "s3://traces/runs/demo/sessions/5/"
    assert proxy["envFrom"] == [{"secretRef": {"name": "bucket-creds"}}]
    assert (sidecar.plan.session_id, sidecar.session_secret) == ("demo-s5", "tfs_secret")
    (harness,) = spec["containers"]
    assert harness["image"] == "ghcr.io/acme/codex:1"
    env = {e["name"]: e["value"] for e in harness["env"]}
    assert env["TRACEFLEET_BASE_URL"] == f"http://127.0.0.1:{PROXY_PORT}"
    assert env["TRACEFLEET_API_KEY"] == "tfs_secret"
    plan = child_reads(HarnessEnv, child, "harness", tmp_path).plan
    assert (plan.harness.preset, plan.task.id) == ("codex", "t2")
    # the plan's files: a ConfigMap of the job's, named for the pod
    (cm,) = child.config_maps
    assert cm["metadata"]["name"] == "demo-s5-a1-plan-0"
    _owner_ok(cm, job)
    # the harness container holds no bucket credentials: only the proxy uploads
    assert "envFrom" not in harness and not any(k.startswith("AWS_") for k in env)
    for ctr in (proxy, harness):
        sc = ctr["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    # capture volume shared by proxy (writer); artifacts written by the harness, read by the proxy
    assert {"name": "capture", "mountPath": "/capture"} in proxy["volumeMounts"]
    assert any(m["name"] == "artifacts" for m in harness["volumeMounts"])
    # the harness starts in spec.harness.workspace.workdir, where the session's copy of the workspace is bound
    assert harness["workingDir"] == plan.harness.workdir == job.spec.harness.workspace.workdir == "/workspace"
    assert {"name": "workspace", "mountPath": "/workspace", "subPath": "workdir"} in harness["volumeMounts"]


def test_the_sidecars_flags_are_its_places_own(job: RolloutJob) -> None:
    """Whatever the job says (engine, capture mode, sampling, limits), the sidecar's argument list is the same: the job's
    proxy reaches it as its plan file, never as a flag."""
    other = yaml.safe_load(MANAGED)
    other["spec"]["inference"] = {"external": {"baseUrl": "http://10.1.2.3:8000", "model": "qwen"},
                                  "capture": {"mode": "server"}, "sampling": {"temperature": 0.7, "topK": 20},
                                  "policyVersion": 3}
    other_job = RolloutJob.model_validate(other)
    args = {tuple(harness_pod(j, CFG, plan_of(j, 0), 0).manifest["spec"]["initContainers"][0]["args"])
            for j in (job, other_job)}
    assert args == {("proxy", "--in-pod", "--host", "0.0.0.0", "--port", str(PROXY_PORT), "--capture-dir", "/capture",
                     "--artifacts-dir", "/artifacts")}


def proxy_plan_of(job: RolloutJob, tmp: Path) -> ProxyPlan:
    """The proxy plan the job's first harness pod's sidecar reads."""
    return child_reads(ProxySidecarEnv, harness_pod(job, CFG, plan_of(job, 0), 0), "proxy", tmp).plan.proxy


def test_proxy_sidecar_reads_the_tokenizer_from_the_model_cache(job: RolloutJob, tmp_path: Path) -> None:
    """Default capture mode (auto) on a managed model with a cache claim: the sidecar mounts the claim
    read-only where vLLM has it ($HF_HOME), offline, and is told the hub id to resolve there."""
    spec = harness_pod(job, CFG, plan_of(job, 0), attempt=0).manifest["spec"]
    (proxy,) = spec["initContainers"]
    planned = proxy_plan_of(job, tmp_path / "a")
    assert (planned.mode, planned.tokenizer) == ("auto", "Qwen/Qwen3-4B")
    assert {"name": "tokenizer-cache", "mountPath": "/root/.cache/huggingface", "readOnly": True} in proxy["volumeMounts"]
    assert {"name": "tokenizer-cache", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in spec["volumes"]
    env = {e["name"]: e.get("value") for e in proxy["env"]}
    assert env["HF_HOME"] == "/root/.cache/huggingface" and env["HF_HUB_OFFLINE"] == "1"
    (harness,) = spec["containers"]
    assert not any(m["name"] == "tokenizer-cache" for m in harness["volumeMounts"])  # the sandbox never sees it
    vllm, _gate = inference_deployment(job, CFG)["spec"]["template"]["spec"]["containers"]
    assert {"name": "HF_HOME", "value": "/root/.cache/huggingface"} in vllm["env"]  # where vLLM downloads to
    assert exact_mode_problem(job) is None

    body = yaml.safe_load(MANAGED)
    body["spec"]["inference"]["capture"] = {"mode": "server"}
    server = harness_pod(RolloutJob.model_validate(body), CFG, plan_of(RolloutJob.model_validate(body), 0), 0).manifest["spec"]
    assert proxy_plan_of(RolloutJob.model_validate(body), tmp_path / "b").mode == "server"
    assert not any(v["name"] == "tokenizer-cache" for v in server["volumes"])

    # external engine: the tokenizer comes from a claim named in capture, with overrides passed through
    body = external_body()
    body["spec"]["inference"]["capture"] = {"mode": "exact", "tokenizer": "/models/qwen3", "toolParser": "qwen3_coder",
                                            "tokenizerCache": {"claimName": "tok", "mountPath": "/models"}}
    ext = RolloutJob.model_validate(body)
    spec = harness_pod(ext, CFG, plan_of(ext, 0), 0).manifest["spec"]
    planned = proxy_plan_of(ext, tmp_path / "c")
    assert (planned.tokenizer, planned.tool_parser) == ("/models/qwen3", "qwen3_coder")
    assert {"name": "tokenizer-cache", "persistentVolumeClaim": {"claimName": "tok", "readOnly": True}} in spec["volumes"]
    assert exact_mode_problem(ext) is None
    # exact asked for with nothing to read a tokenizer from: refused up front, with what to set
    del body["spec"]["inference"]["capture"]["tokenizerCache"]
    problem = exact_mode_problem(RolloutJob.model_validate(body))
    assert problem is not None and "tokenizerCache" in problem and "mode auto" in problem


def no_services(namespace: str, name: str) -> None:
    return None


def test_network_policy_allows_only_inference_bucket_and_dns(job: RolloutJob) -> None:
    np = harness_network_policy(job, job_reach(job, CFG, None, no_services))
    _owner_ok(np, job)
    spec = np["spec"]
    assert spec["podSelector"]["matchLabels"] == {n.LABEL_JOB: "demo", n.LABEL_COMPONENT: "harness"}
    assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["ingress"] == []
    to_inference = [r for r in spec["egress"] if any("podSelector" in t and n.LABEL_COMPONENT in t["podSelector"].get("matchLabels", {}) for t in r.get("to", []))]
    assert to_inference and to_inference[0]["ports"] == [{"protocol": "TCP", "port": ENGINE_PORT}]
    # DNS on any pod of the cluster, whatever the DNS server's labels
    assert spec["egress"][0] == {"to": [{"namespaceSelector": {}}],
                                 "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    assert spec["egress"][2] == {"ports": [{"protocol": "TCP", "port": 443}]}  # the s3 bucket, on AWS: no endpoint named
    assert len(spec["egress"]) == 3


SEAWEED = {"metadata": {"name": "seaweedfs", "namespace": "storage"},
           "spec": {"selector": {"app": "seaweedfs"}, "clusterIP": "10.96.0.40",
                    "ports": [{"name": "s3", "port": 80, "targetPort": 8333}, {"name": "ui", "port": 9333}]}}


def test_bucket_egress_follows_the_endpoint_the_pods_are_given(job: RolloutJob) -> None:
    """The bucket's rule comes from what the pods' environment makes of the endpoint: the operator's
    --bucket-endpoint over the credentials Secret's AWS_ENDPOINT_URL; an in-cluster Service is reached at its pods'
    target port and at its cluster IP, whatever the URL's scheme and port."""
    asked: list[tuple[str, str]] = []

    def services(namespace: str, name: str) -> dict | None:
        asked.append((namespace, name))
        return SEAWEED if (namespace, name) == ("storage", "seaweedfs") else None

    secret = {"AWS_ENDPOINT_URL": "http://seaweedfs.storage.svc.cluster.local", "AWS_ACCESS_KEY_ID": "k"}
    reach = job_reach(job, CFG, secret, services)
    assert asked == [("storage", "seaweedfs")]
    assert reach.bucket == [
        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "storage"}},
                 "podSelector": {"matchLabels": {"app": "seaweedfs"}}}], "ports": [{"protocol": "TCP", "port": 8333}]},
        {"to": [{"ipBlock": {"cidr": "10.96.0.40/32"}}], "ports": [{"protocol": "TCP", "port": 80}]},
    ]
    for policy in (harness_network_policy(job, reach), batch_network_policy(job, reach, n.COMPONENT_SEALER)):
        assert all(rule in policy["spec"]["egress"] for rule in reach.bucket)
    # the operator's flag wins (it is the pods' TRACEFLEET_S3_ENDPOINT); a name in the job's namespace, no Service
    flagged = OperatorConfig(bucket_endpoint="http://minio:9000")
    assert job_reach(job, flagged, secret, services).bucket == [{"ports": [{"protocol": "TCP", "port": 9000}]}]
    assert asked[-1] == ("team", "minio")
    # an address, and a local folder (nothing to reach)
    assert job_reach(job, CFG, {"AWS_ENDPOINT_URL_S3": "https://192.0.2.7:8443"}, services).bucket == [
        {"to": [{"ipBlock": {"cidr": "192.0.2.7/32"}}], "ports": [{"protocol": "TCP", "port": 8443}]}]
    body = yaml.safe_load(MANAGED)
    body["spec"]["output"] = {"uri": "/data/out"}
    assert job_reach(RolloutJob.model_validate(body), flagged, None, services).bucket is None


def test_pods_pull_with_the_operators_and_the_jobs_secrets() -> None:
    body = yaml.safe_load(MANAGED)
    body["spec"]["imagePullSecrets"] = [{"name": "team-registry"}, {"name": "shared-registry"}]
    job = RolloutJob.model_validate(body)
    cfg = OperatorConfig(proxy_image="reg/tracefleet:test", image_pull_secrets=("shared-registry",))
    want = [{"name": "shared-registry"}, {"name": "team-registry"}]
    assert harness_pod(job, cfg, plan_of(job, 0), 0).manifest["spec"]["imagePullSecrets"] == want
    assert evaluator_job(job, cfg, plan_of(job, 0)).manifest["spec"]["template"]["spec"]["imagePullSecrets"] == want
    assert sealer_job(job, cfg, 0, [plan_of(job, 0)]).manifest["spec"]["template"]["spec"]["imagePullSecrets"] == want
    assert inference_deployment(job, cfg)["spec"]["template"]["spec"]["imagePullSecrets"] == want
    # none asked for: no field at all
    plain = RolloutJob.model_validate(yaml.safe_load(MANAGED))
    assert "imagePullSecrets" not in harness_pod(plain, CFG, plan_of(plain, 0), 0).manifest["spec"]
    # a name the API server would refuse is refused by the model
    body["spec"]["imagePullSecrets"] = [{"name": "Team_Registry"}]
    with pytest.raises(ValueError, match="imagePullSecrets"):
        RolloutJob.model_validate(body)


def test_external_engine_gets_ip_block_and_no_deployment(tmp_path: Path) -> None:
    job = RolloutJob.model_validate(external_body())
    assert job.spec.inference.managed is None
    with pytest.raises(AssertionError):
        inference_deployment(job, CFG)
    np = harness_network_policy(job, job_reach(job, CFG, None, no_services))
    rule = np["spec"]["egress"][1]
    assert rule == {"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}], "ports": [{"protocol": "TCP", "port": 8000}]}
    assert proxy_plan_of(job, tmp_path).engine_url == "http://10.1.2.3:8000"


def test_evaluator_job_has_failure_policy_and_deadline(job: RolloutJob, tmp_path) -> None:
    child = evaluator_job(job, CFG, plan_of(job, 6))
    j = child.manifest
    _owner_ok(j, job)
    assert j["metadata"]["name"] == "demo-eval-s6"
    spec = j["spec"]
    assert spec["activeDeadlineSeconds"] == 300
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    assert rules[1]["action"] == "FailJob"
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    (ctr,) = pod["containers"]
    assert ctr["image"] == "ghcr.io/acme/eval:1"
    env = child_reads(EvaluatorEnv, child, "evaluator", tmp_path / "a")
    assert env.session_uri == "s3://traces/runs/demo/sessions/6/"
    # the lag reference of the session's evidence, as local mode keeps it
    body = yaml.safe_load(MANAGED)
    body["spec"]["inference"]["policyVersion"] = 7
    versioned = RolloutJob.model_validate(body)
    child = evaluator_job(versioned, CFG, plan_of(versioned, 6))
    assert child_reads(EvaluatorEnv, child, "evaluator", tmp_path / "b").plan.policy_version == 7
    assert spec["template"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"


def test_sealer_job_pins_its_sessions(job: RolloutJob) -> None:
    j = sealer_job(job, CFG, seq=3, plans=[plan_of(job, i) for i in (7, 1, 2, 3, 6)]).manifest
    _owner_ok(j, job)
    assert j["metadata"]["name"] == "demo-seal-000003"
    assert j["metadata"]["annotations"][n.ANNOTATION_SESSIONS] == "1-3,6-7"
    assert n.decode_ranges("1-3,6-7") == [1, 2, 3, 6, 7]


def test_suspended_job_runs_no_inference(job: RolloutJob) -> None:
    body = yaml.safe_load(MANAGED)
    body["spec"]["suspend"] = True
    assert inference_deployment(RolloutJob.model_validate(body), CFG)["spec"]["replicas"] == 0


def test_long_names_fit_dns_labels() -> None:
    long = "x" * 80
    for name in (n.harness_pod_name(long, 1999, 3), n.evaluator_job_name(long, 5), n.sealer_job_name(long, 2)):
        assert len(name) <= 63
    assert n.harness_pod_name(long, 1, 0) != n.harness_pod_name(long, 2, 0)
