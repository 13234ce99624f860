"""The operator against the real control plane (etcd + kube-apiserver + controller-manager + scheduler + KWOK).

The chart is `helm install`ed (CRDs, RBAC, ServiceAccount, operator Deployment — whose pod KWOK only
pretends to run); the operator itself runs here as a subprocess (`tracefleet operator`) authenticated
with a token of the chart's ServiceAccount, so its least-privilege RBAC is what is exercised.
KWOK cannot run code: the test plays the pods' part with the pods' own code — for a harness pod it
uploads a capture (what the proxy sidecar uploads) and a reward (what the evaluator Job writes) to
the real S3 server and marks the pod Succeeded (or Failed); for a sealer Job it runs the sealer
entrypoint with the Job's own environment. Everything else — pods, Jobs, Deployments, scheduling,
Job completion, garbage collection, CRD schema/CEL validation — is the real control plane.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from fixtures.controlplane import free_port
from fixtures.pod_reads import cluster_config_maps, reads
from tracefleet.contract import layout
from tracefleet.contract import semantics
from tracefleet.bucket import open_bucket
from tracefleet.operator import metrics
from tracefleet.operator import names as n
from tracefleet.operator.webhook import DELIVERY_HEADER, SIGNATURE_HEADER, verify_signature
from tracefleet.contract.podenv import HarnessEnv, ProxySidecarEnv, SealerEnv
from tracefleet.runner.pod.sealer_job import seal
from tracefleet.traces.reader import BatchReader
from tracefleet.traces.synthetic import SyntheticSession

REPO = Path(__file__).resolve().parents[2]
RELEASE_NS = "tracefleet-system"
HMAC_KEY = "s3cr3t-hmac"


LOG_TAIL: list[Callable[[], str]] = []  # set by the env fixture: the operator's log goes into failure messages


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 90, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    tail = LOG_TAIL[0]() if LOG_TAIL else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})\noperator log:\n{tail}")


# ---------------------------------------------------------------- the operator process


@dataclass
class OperatorProc:
    kubeconfig: Path
    log: Path
    metrics_port: int = 0
    liveness_port: int = 0
    proc: subprocess.Popen | None = None
    starts: int = 0
    extra: tuple[str, ...] = ()  # more `tracefleet operator` flags (the Lease's)

    def start(self) -> None:
        self.metrics_port = free_port()
        self.liveness_port = free_port()
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        self.starts += 1
        out = open(self.log, "a")
        out.write(f"\n===== start {self.starts} =====\n")
        out.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tracefleet.operator", "--all-namespaces", "--interval", "1",
             "--retry-backoff", "1", "--metrics-port", str(self.metrics_port), "--bind-address", "127.0.0.1", "--liveness-port", str(self.liveness_port),
             "--proxy-image", "reg.local/tracefleet:test", "--evaluator-image", "reg.local/tracefleet:test", *self.extra],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, exactly what a node loss or OOM kill does."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def metric(self, name: str) -> float:
        import urllib.request

        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " "))

    def tail(self) -> str:
        return self.log.read_text()[-6000:] if self.log.exists() else ""


class Receiver(http.server.BaseHTTPRequestHandler):
    got: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).got.append((dict(self.headers), body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a: object) -> None:
        pass


@dataclass
class Env:
    kube: Any
    api: client.ApiClient
    core: client.CoreV1Api
    apps: client.AppsV1Api
    batch: client.BatchV1Api
    custom: client.CustomObjectsApi
    op: OperatorProc
    s3: Any
    bucket_name: str
    hook_url: str
    sealed: set[str] = field(default_factory=set)

    def bucket_uri(self, ns: str) -> str:
        return f"s3://{self.bucket_name}/{ns}"

    def rj(self, ns: str, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(n.GROUP, n.VERSION, ns, n.PLURAL, name)

    def status(self, ns: str, name: str) -> dict[str, Any]:
        return self.rj(ns, name).get("status") or {}

    def pods(self, ns: str, job: str) -> list[Any]:
        return self.core.list_namespaced_pod(ns, label_selector=n.job_selector(job, n.COMPONENT_HARNESS)).items

    def jobs(self, ns: str, job: str, component: str) -> list[Any]:
        return self.batch.list_namespaced_job(ns, label_selector=n.job_selector(job, component)).items


@pytest.fixture(scope="module")
def env(kube, s3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("operator")
    r = kube.helm("install", "tf", str(REPO / "charts" / "tracefleet"), "--namespace", RELEASE_NS, "--create-namespace",
                  "--set", "image.registry=registry.example.com/team", "--set", "image.tag=test", "--set", "operator.allNamespaces=true", "--wait", "--timeout", "120s")
    assert r.returncode == 0, r.stdout + r.stderr
    # The operator authenticates as the chart's ServiceAccount: its RBAC must be enough.
    sa_kubeconfig = kube.service_account_kubeconfig(RELEASE_NS, "tf-tracefleet", tmp / "operator.kubeconfig")
    # the sandbox RuntimeClass harness pods ask for (KWOK ignores the handler)
    kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                                     "metadata": {"name": "gvisor"}, "handler": "runsc"}))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    api = kube.api_client()
    op = OperatorProc(kubeconfig=sa_kubeconfig, log=tmp / "operator.log")
    op.start()
    LOG_TAIL[:] = [op.tail]
    e = Env(kube=kube, api=api, core=client.CoreV1Api(api), apps=client.AppsV1Api(api), batch=client.BatchV1Api(api),
            custom=client.CustomObjectsApi(api), op=op, s3=s3, bucket_name=s3.create_bucket(),
            hook_url=f"http://127.0.0.1:{srv.server_address[1]}/hook")
    try:
        yield e
    finally:
        op.stop()
        srv.shutdown()
        print("operator log tail:\n" + op.tail())


def new_namespace(env: Env, name: str) -> str:
    env.core.create_namespace({"metadata": {"name": name}})
    wait_for("default ServiceAccount", lambda: env.core.list_namespaced_service_account(name).items, 60)
    creds = {"AWS_ACCESS_KEY_ID": env.s3.access_key, "AWS_SECRET_ACCESS_KEY": env.s3.secret_key,
             "AWS_ENDPOINT_URL": env.s3.endpoint, "AWS_DEFAULT_REGION": env.s3.region}
    env.core.create_namespaced_secret(name, {"metadata": {"name": "bucket-creds"}, "stringData": creds})
    env.core.create_namespaced_secret(name, {"metadata": {"name": "hook"}, "stringData": {"key": HMAC_KEY}})
    return name


def rolloutjob(env: Env, ns: str, name: str, *, tasks: int, samples: int, parallelism: int, per_batch: int,
               max_retries: int = 2, tasks_spec: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "tracefleet.io/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": name, "namespace": ns, "labels": {"kueue.x-k8s.io/queue-name": "gpu"}},
        "spec": {
            "inference": {"managed": {"model": "Qwen/Qwen3-4B", "servedModelName": "qwen", "gpusPerReplica": 1}},
            "harness": {"preset": "codex", "image": "reg.local/codex:1", "runtimeClassName": "gvisor", "sessionTimeoutSeconds": 600},
            "tasks": tasks_spec or {"inline": [{"id": f"t{i}", "prompt": f"task {i}"} for i in range(tasks)],
                                    "samplesPerTask": samples},
            "evaluator": {"preset": "tests", "image": "reg.local/eval:1", "timeoutSeconds": 120},
            "output": {"uri": env.bucket_uri(ns), "credentialsSecretRef": {"name": "bucket-creds"}, "tracesPerBatch": per_batch},
            "trainer": {"webhook": {"url": env.hook_url, "secretRef": {"name": "hook", "key": "key"}}},
            "parallelism": parallelism,
            "maxRetries": max_retries,
            **spec,
        },
    }
    body["spec"] = {k: v for k, v in body["spec"].items() if v is not None}  # e.g. evaluator=None: none
    env.custom.create_namespaced_custom_object(n.GROUP, n.VERSION, ns, n.PLURAL, body)
    return body


def set_pod_phase(env: Env, ns: str, name: str, phase: str) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    code = 0 if phase == "Succeeded" else 1
    statuses = [{"name": "harness", "image": "reg.local/codex:1", "imageID": "", "ready": False, "restartCount": 0,
                 "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                          "startedAt": now, "finishedAt": now}}}]
    env.core.patch_namespaced_pod_status(name, ns, {"status": {"phase": phase, "containerStatuses": statuses}})


def play_harness(env: Env, ns: str, pod: Any, outcome: str = "Succeeded", reward: float = 1.0) -> None:
    """What a real harness pod does when its session ends: the proxy uploads the capture, the
    evaluator later writes the reward; then the pod terminates."""
    labels = pod.metadata.labels
    s = int(labels[n.LABEL_SESSION])
    job = labels[n.LABEL_JOB]
    if outcome == "Succeeded":
        bucket = open_bucket(env.bucket_uri(ns), **env.s3.bucket_options())
        path = Path(f"/tmp/{ns}-{job}-s{s}.jsonl")
        path.unlink(missing_ok=True)
        sess = SyntheticSession(path, f"{job}-s{s}", seed=s)
        first = sess.call(sess.tokens(16))
        sess.call(sess.extend(first, sess.tokens(4)), parent=first)
        sess.close()
        bucket.put(layout.capture_key(job, s), path.read_bytes())
        bucket.put(layout.reward_key(job, s), json.dumps({"reward": reward, "status": "ok"}).encode())
        path.unlink(missing_ok=True)
    set_pod_phase(env, ns, pod.metadata.name, outcome)


def play_sealers(env: Env, ns: str, job: str) -> None:
    """Run each new sealer Job's entrypoint code with that Job's own environment."""
    for sj in env.jobs(ns, job, n.COMPONENT_SEALER):
        if sj.metadata.uid in env.sealed:
            continue
        cenv = reads(SealerEnv, env.api.sanitize_for_serialization(sj.spec.template.spec), "sealer",
                     cluster_config_maps(env.core, ns), Path(tempfile.mkdtemp(prefix=f"{sj.metadata.name}-")))
        bucket = open_bucket(cenv.bucket, **env.s3.bucket_options())
        seal(bucket, cenv.batch_seq, cenv.plans)
        env.sealed.add(sj.metadata.uid)


def key_holders(spec: Any, secret: str) -> set[str]:
    """The containers of a pod spec that get the Secret `secret` (from env, envFrom or a volume of the pod: all)."""
    containers = (spec.init_containers or []) + spec.containers
    if any(v.secret is not None and v.secret.secret_name == secret for v in spec.volumes or []):
        return {c.name for c in containers}
    return {c.name for c in containers
            if any(e.value_from and e.value_from.secret_key_ref and e.value_from.secret_key_ref.name == secret for e in c.env or [])
            or any(f.secret_ref and f.secret_ref.name == secret for f in c.env_from or [])}


def alive(pods: list[Any]) -> list[Any]:
    return [p for p in pods if p.status.phase in (None, "Pending", "Running") and not p.metadata.deletion_timestamp]


def drive(env: Env, ns: str, job: str, *, parallelism: int, timeout: float = 180,
          outcome: Callable[[Any], str] = lambda p: "Succeeded", stop_when: Callable[[], bool] | None = None,
          reward: Callable[[Any], float] = lambda p: 1.0) -> int:
    """Play every Running harness pod and sealer Job until the job finishes; returns the max alive seen."""
    deadline = time.monotonic() + timeout
    max_alive = 0
    while time.monotonic() < deadline:
        if env.status(ns, job).get("phase") in ("Succeeded", "Failed") or (stop_when and stop_when()):
            return max_alive
        live = alive(env.pods(ns, job))
        max_alive = max(max_alive, len(live))
        assert len(live) <= parallelism, f"{len(live)} harness pods alive > parallelism {parallelism}"
        for p in live:
            if p.status.phase == "Running":
                play_harness(env, ns, p, outcome(p), reward(p))
        play_sealers(env, ns, job)
        time.sleep(0.5)
    raise AssertionError(f"{ns}/{job} did not finish: {json.dumps(env.status(ns, job))[:1500]}\n{env.op.tail()}")


def events(env: Env, ns: str, job: str) -> list[Any]:
    return [e for e in env.core.list_namespaced_event(ns).items if e.involved_object.name == job]


# ---------------------------------------------------------------- tests


def test_rolloutjob_runs_to_complete(env: Env) -> None:
    ns = new_namespace(env, "rj-happy")
    Receiver.got.clear()
    rolloutjob(env, ns, "happy", tasks=3, samples=2, parallelism=2, per_batch=2)

    dep = wait_for("inference Deployment", lambda: _get(env.apps.read_namespaced_deployment, "happy-inference", ns))
    ctr = dep.spec.template.spec.containers[0]
    assert ctr.resources.limits["nvidia.com/gpu"] == "1"
    assert ctr.startup_probe.http_get.path == "/health" and ctr.liveness_probe.http_get.path == "/health"
    assert "--served-model-name" in ctr.args and ctr.args[ctr.args.index("--served-model-name") + 1] == "qwen"
    assert dep.metadata.owner_references[0].kind == "RolloutJob"
    svc = wait_for("inference Service", lambda: _get(env.core.read_namespaced_service, "happy-inference", ns))
    assert svc.spec.ports[0].port == 8000
    # the engine gate, in the inference pod the Deployment made: vLLM on loopback, the gate alone on the port the
    # Service targets, with the job's key from a Secret the job owns; in a harness pod only the proxy has the key
    key = wait_for("engine key Secret", lambda: _get(env.core.read_namespaced_secret, "happy-engine-key", ns))
    assert [(o.kind, o.name) for o in key.metadata.owner_references] == [("RolloutJob", "happy")]
    assert len(key.data[n.ENGINE_KEY_SECRET_KEY]) >= 40
    # the trainer's weight sync (`tracefleet policy update --job`) reads the same key
    import base64

    from tracefleet.trainer.replicas import job_engine_key

    assert job_engine_key(ns, "happy", api_client=env.api) == base64.b64decode(key.data[n.ENGINE_KEY_SECRET_KEY]).decode()
    assert job_engine_key(ns, "no-such-job", api_client=env.api) is None
    wait_for("InferenceReady", lambda: any(c["type"] == "InferenceReady" and c["status"] == "True"
                                           for c in env.status(ns, "happy").get("conditions") or []))
    engine_pod = wait_for("inference pod", lambda: next(iter(env.core.list_namespaced_pod(
        ns, label_selector=n.job_selector("happy", n.COMPONENT_INFERENCE)).items), None)).spec
    vllm, gate = engine_pod.containers
    assert (vllm.name, gate.name) == ("vllm", "gate")
    assert vllm.args[vllm.args.index("--host") + 1] == "127.0.0.1" and vllm.args[vllm.args.index("--port") + 1] == "8001"
    assert not vllm.ports and [(p.name, p.container_port) for p in gate.ports] == [(svc.spec.ports[0].target_port, 8000)]
    assert gate.args[:1] == ["engine-gate"] and gate.image == "reg.local/tracefleet:test"
    assert key_holders(engine_pod, "happy-engine-key") == {"vllm", "gate"}
    first = wait_for("harness pods", lambda: env.pods(ns, "happy"))[0]
    spec = first.spec
    assert spec.automount_service_account_token is False and spec.runtime_class_name == "gvisor"
    assert spec.security_context.run_as_non_root is True and spec.active_deadline_seconds == 720
    assert spec.init_containers[0].name == "proxy" and spec.init_containers[0].restart_policy == "Always"
    assert first.metadata.labels["kueue.x-k8s.io/queue-name"] == "gpu"
    netpol = client.NetworkingV1Api(env.api).read_namespaced_network_policy("happy-harness", ns)
    assert netpol.spec.pod_selector.match_labels[n.LABEL_COMPONENT] == "harness"
    assert key_holders(spec, "happy-engine-key") == {"proxy"}

    # rewards that differ within each task's group (sample 0: 1, sample 1: 0), as a GRPO trainer needs
    max_alive = drive(env, ns, "happy", parallelism=2, reward=lambda p: float(p.metadata.labels[n.LABEL_SAMPLE] == "0"))
    assert max_alive == 2
    st = env.status(ns, "happy")
    assert st["phase"] == "Succeeded", st
    c = st["counters"]
    assert (c["total"], c["succeeded"], c["failed"], c["running"], c["pending"]) == (6, 6, 0, 0, 0)
    assert c["traces"] == 6 and c["tokens"] > 0
    assert st["batchesCompleted"] == 3 and len(st["recentBatches"]) == 3
    assert {b["uri"].rsplit("/", 2)[-2] for b in st["recentBatches"]} == {"000000", "000001", "000002"}
    conds = {x["type"]: x for x in st["conditions"]}
    assert conds["Complete"]["status"] == "True" and conds["Running"]["status"] == "False"
    # evaluator Jobs: one per session, run to completion by the real Job controller
    evals = env.jobs(ns, "happy", n.COMPONENT_EVALUATOR)
    assert len(evals) == 6 and all(j.status.succeeded == 1 for j in evals)
    # the batch pods' policies: evaluators (they run the agent's patch) and sealers reach DNS and the bucket only
    policies = {p.metadata.name: p.spec for p in client.NetworkingV1Api(env.api).list_namespaced_network_policy(ns).items}
    assert set(policies) == {"happy-harness", "happy-evaluator", "happy-sealer"}
    batch_pods = {c: [j.spec.template.metadata.labels for j in env.jobs(ns, "happy", c)]
                  for c in (n.COMPONENT_EVALUATOR, n.COMPONENT_SEALER)}
    for name, component in (("happy-evaluator", n.COMPONENT_EVALUATOR), ("happy-sealer", n.COMPONENT_SEALER)):
        chosen = policies[name].pod_selector.match_labels
        assert all(chosen.items() <= labels.items() for labels in batch_pods[component]) and batch_pods[component]
        assert not any(chosen.items() <= labels.items() for other, pods in batch_pods.items() if other != component
                       for labels in pods)
        assert policies[name].policy_types == ["Ingress", "Egress"] and policies[name].ingress is None
        assert len(policies[name].egress) == 2 and not any(t.pod_selector and t.namespace_selector is None
                                                           for r in policies[name].egress for t in r.to or [])
    # batches exist in S3 (manifest last)
    bucket = open_bucket(env.bucket_uri(ns), **env.s3.bucket_options())
    assert sorted(o.key for o in bucket.list("happy/batches/") if o.key.endswith("manifest.json")) == [
        f"happy/batches/{i:06d}/manifest.json" for i in range(3)]
    # read as a trainer reads them: whole groups, named by job and task, with non-zero GRPO advantages
    reader = BatchReader(env.bucket_uri(ns), "happy", consumer="trainer", **env.s3.bucket_options())
    seen = []
    for batch in reader.follow(poll_s=0.5, idle_exit=True):
        t = batch.tensors()
        groups = batch.table.column("group_id").to_pylist()
        assert len(set(groups)) == 1 and sorted(batch.table.column("sample_index").to_pylist()) == [0, 1]
        assert sorted(t["sequence_advantages"].tolist()) == pytest.approx([-1.0, 1.0], abs=1e-3)
        assert float(t["advantages"].abs().sum()) > 0
        seen += groups[:1]
        reader.commit(batch)
    assert sorted(seen) == ["happy/t0", "happy/t1", "happy/t2"]
    # one Event per batch; one signed webhook per batch
    wait_for("3 BatchSealed events", lambda: len([e for e in events(env, ns, "happy") if e.reason == "BatchSealed"]) == 3, 30)
    wait_for("3 webhooks", lambda: len(Receiver.got) >= 3, 30)
    time.sleep(2)
    assert len(Receiver.got) == 3
    ids = set()
    for headers, body in Receiver.got:
        assert verify_signature(HMAC_KEY.encode(), body, headers[SIGNATURE_HEADER])
        ids.add(headers[DELIVERY_HEADER])
        assert json.loads(body)["job"]["name"] == "happy"
    assert len(ids) == 3
    # finished: inference scaled to zero
    wait_for("inference scaled to 0", lambda: env.apps.read_namespaced_deployment("happy-inference", ns).spec.replicas == 0, 30)
    # the operator's own metrics and liveness endpoint
    assert env.op.metric("tracefleet_api_calls_total") > 0
    assert env.op.metric("tracefleet_batches_sealed_total") >= 3
    import urllib.request

    metrics_text = urllib.request.urlopen(f"http://127.0.0.1:{env.op.metrics_port}/metrics", timeout=5).read().decode()
    phases = {line.split('phase="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1]) for line in metrics_text.splitlines()
              if line.startswith("tracefleet_rolloutjobs{") and 'job="happy"' in line and 'namespace="rj-happy"' in line}
    assert phases["Succeeded"] == 1.0 and phases["Running"] == 0.0, phases
    assert urllib.request.urlopen(f"http://127.0.0.1:{env.op.liveness_port}/healthz", timeout=5).status == 200


def test_quarantine_rate_is_counted_warned_and_the_job_goes_on(env: Env) -> None:
    """spec.diagnostics quarantine sessions rewarded for an empty diff (these harness pods upload no patch):
    sample 0 of each task gets reward 1, so half the sealed sessions are quarantined; over
    diagnosticsPolicy's 0.25 once 4 are judged: condition, one Warning Event, counters and metrics."""
    ns = new_namespace(env, "rj-quarantine")
    rolloutjob(env, ns, "hacks", tasks=3, samples=2, parallelism=2, per_batch=2,
               diagnostics=[{"name": "success_without_work", "action": "quarantine"}],
               diagnosticsPolicy={"maxQuarantineRate": 0.25, "minJudgedSessions": 4})
    drive(env, ns, "hacks", parallelism=2, reward=lambda p: float(p.metadata.labels[n.LABEL_SAMPLE] == "0"))
    st = env.status(ns, "hacks")
    assert st["phase"] == "Succeeded", st  # the job goes on (tracefleet.contract.semantics)
    c = st["counters"]
    assert (c["succeeded"], c["judged"], c["quarantined"], c["dropped"]) == (6, 6, 3, 0), c
    cond = {x["type"]: x for x in st["conditions"]}[semantics.QUARANTINE_RATE_EXCEEDED]
    assert (cond["status"], cond["reason"]) == ("True", semantics.REASON_QUARANTINE_RATE_ABOVE)
    assert cond["message"] == ("3 of 6 judged sessions quarantined (50%) > maxQuarantineRate 0.25; "
                               "by diagnostic: success_without_work 3")
    warned = wait_for("the Warning Event", lambda: [e for e in events(env, ns, "hacks")
                                                   if e.reason == semantics.REASON_QUARANTINE_RATE_ABOVE], 30)
    assert len(warned) == 1 and warned[0].type == "Warning" and warned[0].count in (None, 1)
    # raised when the batches recorded made at least 4 judged sessions (one reconcile may record two)
    assert re.match(r"QuarantineRateExceeded: (2 of 4|3 of 6) judged sessions quarantined \(50%\) > maxQuarantineRate 0\.25",
                    warned[0].message), warned[0].message
    # what a trainer reads agrees: the rewarded empty-diff sessions are out of training
    reader = BatchReader(env.bucket_uri(ns), "hacks", **env.s3.bucket_options())
    assert sorted(i for s in reader.seqs() for i in reader.read(s).training_table().column("sample_index").to_pylist()) == [1, 1, 1]
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{env.op.metrics_port}/metrics", timeout=5).read().decode()
    mine = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if 'job="hacks"' in line and 'namespace="rj-quarantine"' in line}
    assert mine[f'{metrics.SESSIONS_QUARANTINED}_total{{diagnostic="success_without_work",job="hacks",namespace="rj-quarantine"}}'] == 3
    assert mine[f'{metrics.SESSIONS_JUDGED}_total{{job="hacks",namespace="rj-quarantine"}}'] == 6
    assert mine[f'{metrics.QUARANTINE_RATE}{{job="hacks",namespace="rj-quarantine"}}'] == 0.5


def test_restart_mid_job_no_duplicates(env: Env) -> None:
    ns = new_namespace(env, "rj-restart")
    rolloutjob(env, ns, "rs", tasks=4, samples=2, parallelism=3, per_batch=3)
    done: list[str] = []

    def half_then_kill() -> bool:
        return len(done) >= 3

    wait_for("harness pods", lambda: env.pods(ns, "rs"), 90)

    def outcome(p: Any) -> str:
        done.append(p.metadata.name)
        return "Succeeded"

    drive(env, ns, "rs", parallelism=3, outcome=outcome, stop_when=half_then_kill)
    env.op.kill()
    time.sleep(2)
    env.op.start()
    drive(env, ns, "rs", parallelism=3)
    st = env.status(ns, "rs")
    assert st["phase"] == "Succeeded" and st["counters"]["succeeded"] == 8
    pods = env.pods(ns, "rs")
    sessions = Counter(p.metadata.labels[n.LABEL_SESSION] for p in pods)
    assert len(pods) == 8 and set(sessions.values()) == {1}, sessions  # no duplicate pods
    sealers = env.jobs(ns, "rs", n.COMPONENT_SEALER)
    covered = [s for j in sealers for s in n.decode_ranges(j.metadata.annotations[n.ANNOTATION_SESSIONS])]
    assert sorted(covered) == list(range(8))  # every session in exactly one batch
    bucket = open_bucket(env.bucket_uri(ns), **env.s3.bucket_options())
    manifests = [o.key for o in bucket.list("rs/batches/") if o.key.endswith("manifest.json")]
    # batches hold whole groups: tracesPerBatch 3 with 2 samples per task is 2 groups (4 sessions) per batch
    assert len(manifests) == len(sealers) == semantics.batch_count(4, 3, 2) == 2 == st["batchesCompleted"]


def test_failed_sessions_are_retried_then_counted(env: Env) -> None:
    ns = new_namespace(env, "rj-retry")
    rolloutjob(env, ns, "rt", tasks=2, samples=2, parallelism=4, per_batch=4, max_retries=1)
    # session 0 always fails; session 1 fails once then succeeds
    fails: Counter = Counter()

    def outcome(p: Any) -> str:
        s = int(p.metadata.labels[n.LABEL_SESSION])
        if s == 0 or (s == 1 and fails[s] == 0):
            fails[s] += 1
            return "Failed"
        return "Succeeded"

    drive(env, ns, "rt", parallelism=4, outcome=outcome)
    st = env.status(ns, "rt")
    assert st["phase"] == "Succeeded"
    assert (st["counters"]["succeeded"], st["counters"]["failed"]) == (3, 1)
    attempts = sorted((p.metadata.labels[n.LABEL_SESSION], p.metadata.labels[n.LABEL_ATTEMPT]) for p in env.pods(ns, "rt"))
    assert attempts == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1"), ("2", "0"), ("3", "0")]
    # the failed session is sealed too (one fail-closed row without tokens: it failed before any model call),
    # so its group stays whole: one batch of both groups (tracesPerBatch 4 = 2 groups of 2)
    assert st["batchesCompleted"] == 1 and st["recentBatches"][0]["traces"] == 4


def test_suspend_resume_then_delete_cascades(env: Env) -> None:
    ns = new_namespace(env, "rj-suspend")
    rolloutjob(env, ns, "sp", tasks=3, samples=1, parallelism=2, per_batch=3)
    wait_for("2 running pods", lambda: len([p for p in alive(env.pods(ns, "sp")) if p.status.phase == "Running"]) == 2)
    env.custom.patch_namespaced_custom_object(n.GROUP, n.VERSION, ns, n.PLURAL, "sp", {"spec": {"suspend": True}})
    wait_for("phase Suspended", lambda: env.status(ns, "sp").get("phase") == "Suspended")
    wait_for("harness pods gone", lambda: not env.pods(ns, "sp"), 60)
    assert env.apps.read_namespaced_deployment("sp-inference", ns).spec.replicas == 0
    time.sleep(3)
    assert not env.pods(ns, "sp")  # suspended: nothing new is created
    env.custom.patch_namespaced_custom_object(n.GROUP, n.VERSION, ns, n.PLURAL, "sp", {"spec": {"suspend": False}})
    drive(env, ns, "sp", parallelism=2)
    assert env.status(ns, "sp")["counters"]["succeeded"] == 3
    # deleting the RolloutJob removes every child (ownerReferences + the real garbage collector)
    env.custom.delete_namespaced_custom_object(n.GROUP, n.VERSION, ns, n.PLURAL, "sp")
    wait_for("RolloutJob gone (finalizer released)", lambda: _get(env.custom.get_namespaced_custom_object, n.GROUP, n.VERSION, ns, n.PLURAL, "sp") is None, 60)
    wait_for("children garbage-collected", lambda: not env.pods(ns, "sp") and not env.batch.list_namespaced_job(ns).items
             and not env.apps.list_namespaced_deployment(ns).items, 90)


def test_ttl_after_finished_deletes_job_and_children(env: Env) -> None:
    ns = new_namespace(env, "rj-ttl")
    rolloutjob(env, ns, "tt", tasks=1, samples=1, parallelism=1, per_batch=1, ttlSecondsAfterFinished=2)
    drive(env, ns, "tt", parallelism=1)
    # the TTL (2 s) and a pass or two, not kopf's default minute of waiting for the timer that deleted it to exit
    wait_for("TTL deletion", lambda: _get(env.custom.get_namespaced_custom_object, n.GROUP, n.VERSION, ns, n.PLURAL, "tt") is None, 30)
    wait_for("children garbage-collected", lambda: not env.pods(ns, "tt") and not env.batch.list_namespaced_job(ns).items, 90)


def test_immutable_spec_change_is_refused_by_condition(env: Env) -> None:
    ns = new_namespace(env, "rj-immutable")
    rolloutjob(env, ns, "im", tasks=2, samples=1, parallelism=1, per_batch=2)
    wait_for("first pod", lambda: env.pods(ns, "im"))
    env.custom.patch_namespaced_custom_object(n.GROUP, n.VERSION, ns, n.PLURAL, "im",
                                              {"spec": {"tasks": {"samplesPerTask": 3}}})
    cond = wait_for("SpecAccepted=False", lambda: next((c for c in env.status(ns, "im").get("conditions") or []
                                                        if c["type"] == "SpecAccepted" and c["status"] == "False"), None))
    assert cond["reason"] == "ImmutableFieldChanged" and "tasks" in cond["message"]
    assert cond["observedGeneration"] == 2
    assert any(e.reason == "ImmutableFieldChanged" and e.type == "Warning" for e in events(env, ns, "im"))
    for p in alive(env.pods(ns, "im")):
        if p.status.phase == "Running":
            play_harness(env, ns, p)
    time.sleep(3)
    assert len(env.pods(ns, "im")) == 1  # no new sessions under a changed spec
    # reverting the change lets the job go on
    env.custom.patch_namespaced_custom_object(n.GROUP, n.VERSION, ns, n.PLURAL, "im",
                                              {"spec": {"tasks": {"samplesPerTask": 1}}})
    drive(env, ns, "im", parallelism=1)
    assert env.status(ns, "im")["counters"]["succeeded"] == 2


class EngineStub(http.server.BaseHTTPRequestHandler):
    """An engine's model list: the external engine the trainer owns (only its reachability matters here)."""

    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps({"object": "list", "data": [{"id": "policy", "object": "model"}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


def test_external_engine_reachability_gates_sessions(env: Env) -> None:
    ns = new_namespace(env, "rj-external")
    dead = f"http://127.0.0.1:{free_port()}"
    rolloutjob(env, ns, "down", tasks=1, samples=1, parallelism=1, per_batch=1,
               inference={"external": {"baseUrl": dead, "model": "policy"}})
    cond = wait_for("InferenceReady=False", lambda: next((c for c in env.status(ns, "down").get("conditions") or []
                                                          if c["type"] == "InferenceReady" and c["status"] == "False"), None))
    assert cond["reason"] == "EndpointUnreachable"
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EngineStub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        rolloutjob(env, ns, "up", tasks=1, samples=2, parallelism=2, per_batch=2,
                   inference={"external": {"baseUrl": url, "model": "policy"}})
        drive(env, ns, "up", parallelism=2)
        st = env.status(ns, "up")
        assert st["phase"] == "Succeeded" and st["counters"]["succeeded"] == 2
        assert not env.apps.list_namespaced_deployment(ns).items  # no managed inference
        pod = env.pods(ns, "up")[0]
        sidecar = reads(ProxySidecarEnv, env.api.sanitize_for_serialization(pod)["spec"], "proxy",
                        cluster_config_maps(env.core, ns), Path(tempfile.mkdtemp(prefix="up-proxy-")))
        assert sidecar.plan.proxy.engine_url == url
        assert not env.pods(ns, "down")  # unreachable engine: no session was started
    finally:
        srv.shutdown()


def test_exact_capture_without_a_tokenizer_source_fails_with_invalid_spec(env: Env) -> None:
    """`capture.mode: exact` where no proxy sidecar could read the tokenizer (no model cache, no tokenizer
    claim): the job fails up front with what to set, instead of crash-looping sidecars."""
    ns = new_namespace(env, "rj-exact")
    rolloutjob(env, ns, "ex", tasks=1, samples=1, parallelism=1, per_batch=1,
               inference={"managed": {"model": "Qwen/Qwen3-4B", "gpusPerReplica": 1}, "capture": {"mode": "exact"}})
    cond = wait_for("Failed=True", lambda: next((c for c in env.status(ns, "ex").get("conditions") or []
                                                 if c["type"] == "Failed" and c["status"] == "True"), None))
    assert cond["reason"] == "InvalidSpec" and "tokenizerCache" in cond["message"]
    assert env.status(ns, "ex")["phase"] == "Failed" and not env.pods(ns, "ex")


def _harbor_source(env: Env, ns: str, root: Path) -> str:
    """The task folders under `root`, uploaded under an s3:// prefix (how a cluster job names them)."""
    uri = f"{env.bucket_uri(ns)}/harbor-tasks"
    bucket = open_bucket(uri, **env.s3.bucket_options())
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        bucket.put(path.relative_to(root).as_posix(), path.read_bytes())
    return uri


def test_harbor_job_runs_each_session_in_its_task_image(env: Env, tmp_path: Path) -> None:
    """spec.tasks.harbor from an s3:// prefix: one harness pod per session in the task's own image (task.toml's
    docker_image, else the name `tracefleet tasks build --push` gave it under spec.tasks.harbor.registry), with
    task.toml's resources, the harness bundle copied in by an init container into the shared volume, the session
    program beside the task container; a folder with a problem is a Warning Event and the others run; a finished
    session's evaluator Job runs Harbor's verifier in the task image."""
    from kubernetes.utils import parse_quantity

    from fixtures.harbor_tasks import TASK_TOML, write_task
    from tracefleet.contract import task_image as ti
    from tracefleet.harbor.image_names import DIGEST_CHARS, environment_digest
    from tracefleet.harbor.task_image_programs import LAUNCHER, VERIFIER

    root = tmp_path / "tasks"
    greet = write_task(root, "greet")  # cpus 1, memory_mb 1024, built from environment/
    write_task(root, "prebuilt", dockerfile=None, verifier_timeout=45,
               toml=TASK_TOML.format(verifier_timeout=45).replace("[agent]\n", '[agent]\nnetwork_mode = "public"\n')
               + 'docker_image = "reg.local/tasks/prebuilt:2"\nstorage_mb = 2048\ngpus = 1\nworkdir = "/srv"\n')
    write_task(root, "no-instruction", instruction=None)
    ns = new_namespace(env, "rj-harbor")
    uri = _harbor_source(env, ns, root)
    rolloutjob(env, ns, "hb", tasks=2, samples=1, parallelism=2, per_batch=2, evaluator=None,
               tasks_spec={"harbor": {"uri": uri, "registry": "reg.local:5000/team"}, "samplesPerTask": 1})
    listed = wait_for("2 harness pods", lambda: (lambda ps: ps if len(ps) == 2 else None)(env.pods(ns, "hb")))
    pods = {p.metadata.labels[n.LABEL_TASK]: p for p in listed}
    assert env.status(ns, "hb")["counters"]["total"] == 2  # the folder without instruction.md is left out
    warning = wait_for("the left-out folder's Event", lambda: [e for e in events(env, ns, "hb") if e.reason == "HarborTaskLeftOut"])
    assert "no-instruction/instruction.md" in warning[0].message and warning[0].type == "Warning"

    def quantities(d: dict[str, str] | None) -> dict[str, Any]:
        return {k: parse_quantity(v) for k, v in (d or {}).items()}

    digest = environment_digest(greet / "environment")[:DIGEST_CHARS]
    for task, image, resources, workdir in (
        ("0", f"reg.local:5000/team/tracefleet-task/greet:{digest}", {"cpu": "1", "memory": "1Gi"}, None),
        ("1", "reg.local/tasks/prebuilt:2", {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "2Gi", "nvidia.com/gpu": "1"}, "/srv"),
    ):
        spec = pods[task].spec
        harness, session = spec.containers
        assert (harness.name, harness.image, harness.command) == ("harness", image, ["sh", "-c", LAUNCHER])
        assert quantities(harness.resources.requests) == quantities(harness.resources.limits) == quantities(resources)
        assert harness.security_context.run_as_user == 0 and not harness.security_context.allow_privilege_escalation
        assert {e.name: e.value for e in harness.env or []}.get("TRACEFLEET_TASK_WORKDIR") == workdir
        assert [c.name for c in spec.init_containers] == ["proxy", "bundle"]
        assert key_holders(spec, "hb-engine-key") == {"proxy"}  # not the task's container, nor the session program
        bundle = spec.init_containers[1]
        assert bundle.image == "reg.local/codex:1" and ti.BUNDLE_SOURCE_DIR in bundle.command[-1]
        shared = next(v for v in spec.volumes if v.name == ti.SHARED_VOLUME)
        assert shared.empty_dir is not None
        for c in (bundle, harness, session):
            assert any(m.name == ti.SHARED_VOLUME and m.mount_path == ti.SHARED_DIR for m in c.volume_mounts)
        session_env = {e.name: e.value for e in session.env}
        assert session.command == ["tracefleet", "run", "--in-pod"] and session.security_context.run_as_non_root
        assert session_env["TRACEFLEET_LAUNCH_DIR"] == ti.LAUNCH_DIR
        shipped = reads(HarnessEnv, env.api.sanitize_for_serialization(pods[task])["spec"], "session",
                        cluster_config_maps(env.core, ns), tmp_path / f"plan-{task}").plan
        assert shipped.task.id == ("greet", "prebuilt")[int(task)]
        if task == "0":
            assert shipped.task.prompt == "Make greet.py greet harbor.\n"

    # the network each task.toml asks for, as the platform team sees it: every harness pod under the job's policy (the
    # engine, the bucket, DNS); only the pods of the task whose agent asks for "public" also under the public one, which
    # leaves the cluster's own and the metadata service's addresses out
    policies = {p.metadata.name: p.spec for p in client.NetworkingV1Api(env.api).list_namespaced_network_policy(ns).items}
    assert set(policies) == {"hb-harness", "hb-evaluator", "hb-sealer", "hb-harness-public"}

    def selects(policy: str, pod: Any) -> bool:
        return all(pod.metadata.labels.get(k) == v for k, v in policies[policy].pod_selector.match_labels.items())
    assert [(selects("hb-harness", pods[t]), selects("hb-harness-public", pods[t])) for t in "01"] == [(True, False), (True, True)]
    public = policies["hb-harness-public"]
    assert public.policy_types == ["Egress"] and len(public.egress) == 1 and public.egress[0].ports is None
    blocks = {b.ip_block.cidr: b.ip_block._except for b in public.egress[0].to}
    assert set(blocks) == {"0.0.0.0/0", "::/0"} and {"10.0.0.0/8", "169.254.0.0/16"} <= set(blocks["0.0.0.0/0"])

    play_harness(env, ns, wait_for("greet's pod running", lambda: next(
        (p for p in env.pods(ns, "hb") if p.metadata.labels[n.LABEL_TASK] == "0" and p.status.phase == "Running"), None)))
    evaluator = wait_for("greet's evaluator Job", lambda: next(iter(env.jobs(ns, "hb", n.COMPONENT_EVALUATOR)), None))
    pod = evaluator.spec.template.spec
    # the verifier's pod (the agent's change set runs there): no ingress, DNS and the bucket only, no engine; greet's
    # verifier has no network of its own, so not the public policy either
    labelled = type("Pod", (), {"metadata": evaluator.spec.template.metadata})
    assert (selects("hb-evaluator", labelled), selects("hb-harness-public", labelled)) == (True, False)
    assert policies["hb-evaluator"].ingress is None and policies["hb-evaluator"].policy_types == ["Ingress", "Egress"]
    assert not any(t.pod_selector for r in policies["hb-evaluator"].egress for t in r.to or [] if t.namespace_selector is None)
    fetch, verify = pod.init_containers
    assert (fetch.name, verify.name, pod.containers[0].name) == ("fetch", "verify", "evaluator")
    assert (verify.image, verify.command) == (f"reg.local:5000/team/tracefleet-task/greet:{digest}", ["sh", "-c", VERIFIER])
    verify_env = {e.name: e.value for e in verify.env}
    assert verify_env["TRACEFLEET_VERIFIER_TIMEOUT_S"] == "120" and verify_env["PYTHONSAFEPATH"] == "1"
    assert {m.mount_path for m in verify.volume_mounts} == {ti.SHARED_DIR, "/tests", "/logs/verifier"}
    # the plan, whole: the task's tests are read again from the task source
    from tracefleet.contract.podenv import EvaluatorEnv

    pod_spec, config_maps = env.api.sanitize_for_serialization(pod), cluster_config_maps(env.core, ns)
    report_env = reads(EvaluatorEnv, pod_spec, "evaluator", config_maps, tmp_path / "evaluator-plan")
    shipped = report_env.plan
    assert shipped.task.harbor is not None and shipped.task.harbor.folder == uri

    # the tracefleet-image steps with the Job's own environment, against the real S3 server: fetch takes the
    # change set the harness pod uploaded and the task's tests from the source; report stores the verdict
    from tracefleet.runner.pod.harbor_verifier import fetch as harbor_fetch, report

    s = int(evaluator.metadata.labels[n.LABEL_SESSION])
    cenv = reads(EvaluatorEnv, pod_spec, "fetch", config_maps, tmp_path / "fetch-plan")
    bucket = open_bucket(cenv.bucket, **env.s3.bucket_options())
    for name in (ti.CHANGES, ti.DELETED):
        bucket.put(layout.artifacts_prefix("hb", s) + name, b"")
    shared = tmp_path / "shared"
    with _aws_env(env):
        assert harbor_fetch(bucket, cenv, shared / "eval") is None
    assert (shared / "eval" / "tests" / "test.sh").read_text() == (greet / "tests" / "test.sh").read_text()
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "reward.txt").write_text("1\n")
    (shared / "eval" / ti.EXIT_CODE).write_text("0\n")
    verdict, code = report(bucket, report_env, shared / "eval", logs)
    assert (verdict.reward, verdict.status, verdict.task_id, code) == (1.0, "ok", "greet", 0)
    assert json.loads(bucket.get(layout.reward_key("hb", s)))["evaluator"] == ti.HARBOR_EVALUATOR


class _aws_env:
    """The bucket credentials the Job's pods get from the job's Secret (envFrom), for a step played here."""

    def __init__(self, env: Env) -> None:
        self.values = {"AWS_ACCESS_KEY_ID": env.s3.access_key, "AWS_SECRET_ACCESS_KEY": env.s3.secret_key,
                       "AWS_ENDPOINT_URL": env.s3.endpoint, "AWS_DEFAULT_REGION": env.s3.region}

    def __enter__(self) -> None:
        self.saved = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc: object) -> None:
        for k, v in self.saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def test_harbor_tasks_outside_the_bucket_fail_with_invalid_spec(env: Env) -> None:
    """A directory on the operator's machine is no task source on a cluster: one line, no pods."""
    ns = new_namespace(env, "rj-harbor-dir")
    rolloutjob(env, ns, "hd", tasks=1, samples=1, parallelism=1, per_batch=1, evaluator=None,
               tasks_spec={"harbor": {"uri": "/data/tb2", "include": ["swe-*"]}})
    cond = wait_for("Failed=True", lambda: next((c for c in env.status(ns, "hd").get("conditions") or []
                                                 if c["type"] == "Failed" and c["status"] == "True"), None))
    assert cond["reason"] == "InvalidSpec"
    assert cond["message"].startswith("spec.tasks.harbor.uri: /data/tb2 is not in a bucket")
    assert not env.pods(ns, "hd")


@pytest.mark.parametrize(
    "mutate,expect",
    [
        (lambda s: s["inference"].update(external={"baseUrl": "http://e:8000"}), "exactly one of managed or external"),
        (lambda s: s.update(parallelism=0), "parallelism"),
        (lambda s: s["harness"].pop("preset"), "one of preset or command"),
        (lambda s: s["output"].update(uri="gs://nope"), "must be s3://BUCKET"),
    ],
)
def test_invalid_rolloutjobs_rejected_by_apiserver(env: Env, mutate: Callable, expect: str) -> None:
    body = {
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "bad", "namespace": "default"},
        "spec": {"inference": {"managed": {"model": "m"}}, "harness": {"preset": "codex", "image": "i"},
                 "tasks": {"inline": [{"id": "a", "prompt": "p"}]}, "output": {"uri": "s3://bucket/x"}},
    }
    mutate(body["spec"])
    with pytest.raises(ApiException) as e:
        env.custom.create_namespaced_custom_object(n.GROUP, n.VERSION, "default", n.PLURAL, body)
    assert e.value.status == 422 and expect in e.value.body


def lease_holder(env: Env, name: str) -> str | None:
    lease = _get(client.CoordinationV1Api(env.api).read_namespaced_lease, name, RELEASE_NS)
    return lease.spec.holder_identity if lease else None


def test_two_replicas_leader_killed_mid_job(env: Env, tmp_path: Path) -> None:
    """The chart's two replicas on one Lease (short timings here): the leader is SIGKILLed mid-job, the standby
    takes the Lease and finishes the job - no child created twice, the counters and Events as with one operator."""
    ns = new_namespace(env, "rj-ha")
    lease_s, retry_s = 6.0, 1.0
    flags = ("--leader-elect", "--lease-namespace", RELEASE_NS, "--lease-name", "ha-test", "--lease-duration", str(lease_s),
             "--lease-renew-deadline", "4.5", "--lease-retry", str(retry_s))
    ops = {who: OperatorProc(kubeconfig=env.op.kubeconfig, log=tmp_path / f"{who}.log", extra=(*flags, "--lease-identity", who))
           for who in ("a", "b")}
    env.op.stop()  # the module's operator runs without the Lease: it must not reconcile beside the pair
    LOG_TAIL[:] = [lambda: "\n".join(f"--- {w}\n{o.tail()}" for w, o in ops.items())]
    try:
        ops["a"].start()
        wait_for("a holds the Lease", lambda: lease_holder(env, "ha-test") == "a", 60)
        ops["b"].start()
        rolloutjob(env, ns, "ha", tasks=4, samples=2, parallelism=3, per_batch=4)
        done: list[str] = []

        def outcome(p: Any) -> str:
            done.append(p.metadata.name)
            return "Succeeded"

        drive(env, ns, "ha", parallelism=3, outcome=outcome, stop_when=lambda: len(done) >= 3)
        leader = lease_holder(env, "ha-test")
        standby = "b" if leader == "a" else "a"
        killed = time.monotonic()
        ops[leader].kill()
        wait_for("the standby takes the Lease", lambda: lease_holder(env, "ha-test") == standby, 60, interval=0.2)
        takeover_s = time.monotonic() - killed
        print(f"takeover after SIGKILL: {takeover_s:.1f} s (lease {lease_s:g} s, retry {retry_s:g} s)")
        assert takeover_s <= lease_s + 2 * retry_s + 5  # + the API server's and the processes' latency on a busy machine
        drive(env, ns, "ha", parallelism=3)
        st = env.status(ns, "ha")
        assert st["phase"] == "Succeeded"
        assert {k: st["counters"][k] for k in ("total", "succeeded", "failed", "running", "pending")} == \
            {"total": 8, "succeeded": 8, "failed": 0, "running": 0, "pending": 0}
        pods = env.pods(ns, "ha")
        assert sorted(int(p.metadata.labels[n.LABEL_SESSION]) for p in pods) == list(range(8))  # each session once
        evals = env.jobs(ns, "ha", n.COMPONENT_EVALUATOR)
        assert sorted(int(j.metadata.labels[n.LABEL_SESSION]) for j in evals) == list(range(8))
        sealers = env.jobs(ns, "ha", n.COMPONENT_SEALER)
        covered = [s for j in sealers for s in n.decode_ranges(j.metadata.annotations[n.ANNOTATION_SESSIONS])]
        assert sorted(covered) == list(range(8)) and len(sealers) == st["batchesCompleted"] == 2
        sealed = [e for e in events(env, ns, "ha") if e.reason == "BatchSealed"]
        assert sorted(e.message.split(":")[0] for e in sealed) == ["batch 0 sealed", "batch 1 sealed"]
        assert all((e.count or 1) == 1 for e in sealed)
        assert len([e for e in events(env, ns, "ha") if e.reason == "AllSessionsFinished"]) == 1
    finally:
        for o in ops.values():
            o.stop()
        env.op.start()
        LOG_TAIL[:] = [env.op.tail]


def _get(fn: Callable, *args: Any) -> Any:
    try:
        return fn(*args)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
