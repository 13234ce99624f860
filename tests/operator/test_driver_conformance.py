"""Driver conformance (design invariant 6): one RolloutJob run by `tracefleet run` and by the operator on
a real node gives a trainer the same batches (tracefleet.contract.semantics).

Real parts: the real node (tests/fixtures/node.py: kubelet, containerd, CNI, cluster DNS) with the chart installed by
`helm install` (the operator as its Deployment) and SeaweedFS in the cluster on its usual HTTP port
(tests/fixtures/node_jobs.py), the scripted engine on this machine's address, the images `tracefleet images build`
makes. Each harness pod (proxy native sidecar + `tracefleet run --in-pod` in the tracefleet image), each evaluator Job
and sealer Job runs on the node; the kubelet reports their phases. `tracefleet run` runs the same job here, against the
same engine and the same bucket (through the Service's address, as a trainer reads it). Measured (2 cores shared
with other sessions' suites): `kubectl apply` to Succeeded 63 s for the inline job (first sealed batch 40 s), 81 s
for the Harbor job; `tracefleet run` 9 s and 11 s.

The job: 3 tasks × 3 samples, a deterministic harness whose rewards differ within each group, one
session that fails after its model call (not retried: its failure is data), one that fails before its
first model call (retried), one whose evaluator errors (fail-closed, the policy's), one whose evaluator cannot
run (it exits 75 at both judgings: the infrastructure's, left out of its group's statistics and the loss as a
trainer reads it, counted in the manifest, the run's summary and status.counters.infrastructure; the other
samples' advantages are those of the group without it). A sampling engine gives each
sample of a task a different answer, and which sample index gets which answer depends on scheduling;
here the harness draws its behaviour from a per-task counter for the same reason (`DrawingEngine`: a file here, where
`tracefleet run`'s harness reaches only its proxy; at the engine's address for a pod, the one address a harness pod
may reach besides its sidecar). So rows are compared
per group as multisets, and every column a trainer reads must agree except timings:

- `session_id` / `trace_id` / `sample_index` ↔ row content: which draw a session got (see above); the
  (session id, sample index) pairs of each group are compared (one id format in both drivers).
- in `metadata_json`: the timings (`timings`, `extra.timings`, the evaluation's `duration_s`) and the
  reconstruction stats (they name call ids); span and finding `call_id`s (random per call). Everything else in the
  trace metadata agrees: the evaluator's output, the session's status, task metadata.

Before the rows, the plans: each driver plans every session with the one planner on the contract floor
(tracefleet.contract.plan.plan_sessions), and the SessionPlan each first-attempt harness pod was given (its one
plan files, mounted from its ConfigMaps and read as the pod program reads them) equals, field by field, the one `tracefleet run` builds
for that session (LocalRun.plans), for the inline job and the Harbor job; only a Harbor task's folder differs (a
folder here, the task source on the cluster: where its tests are read again). So does the proxy's: the ProxyPlan each
pod's sidecar was given (tracefleet.contract.plan.plan_proxy in both) equals the one `tracefleet run`'s in-process
proxy ran (LocalRun.proxy_plan), field by field.

The harness reports the environment it saw (every variable but the place's own: the machine's PATH/locale, the
image's and the cluster's (KUBERNETES_*, HOSTNAME), with this
session's own proxy address, secret, HOME and workspace named instead of spelled out): a digest of it is
in its model call (so in the tokens) and the whole of it in the evaluator's output (trace metadata).
The job's `spec.harness.env` overrides a preset variable (NO_COLOR) and tries to route the harness
elsewhere (OPENAI_BASE_URL), which the session's own endpoint overrides (tracefleet.runner.environment).

A Harbor job, the same comparison: 2 Harbor task folders in an s3:// source × 2 samples, an agent (Node.js, one
model call, its answer to a file in the task's /app) judged by each task's tests/test.sh: one solved (reward.txt),
one not, with reward.json's second metric. Locally each session runs in a podman container of the task's image; on
the node each harness pod runs the task's image (the base image, loaded into containerd) with the harness image's
bundle copied in by its init container, and each evaluator Job's verifier a fresh container of it. Every compared column
agrees, the evaluation's metrics, the task's [metadata] and the diagnostics included; what differs is outside the
rows (container names, the pod's volume paths, the engine's timings), so nothing more is excluded. Two real
differences this found, fixed at the root: the pods' task had no [metadata] (now both drivers make it with
tracefleet.contract.plan.harbor_task), and the
pod's session.patch was empty, so a solved row was flagged `success_without_work` on the cluster only (the task
container's launcher now keeps its working directory as the image has it: runner.pod.task_image.workspace_diff).
"""

from __future__ import annotations

import http.client
import json
import textwrap
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fixtures.node_jobs import (CREDENTIALS_SECRET, HARNESS_IMAGE, NAMESPACE, TRACEFLEET_IMAGE, Installed, apply_job,
                                assert_children_ran)
from fixtures.pod_reads import cluster_config_maps, reads
from fixtures.harbor_tasks import ANSWER_AGENT_JS, ANSWER_TEST_SH, answer_task_toml
from fixtures.local_runs import run_local
from tracefleet.bucket import open_bucket
from tracefleet.contract import layout, semantics
from tracefleet.contract import task_image as ti
from tracefleet.contract.podenv import HarnessEnv, ProxySidecarEnv
from tracefleet.contract.proxy_plan import ProxyPlan
from tracefleet.contract.session import SessionPlan
from tracefleet.operator import names as n
from tracefleet.runner.containers.runtime import BASE_IMAGE
from tracefleet.traces.reader import BatchReader

JOB = "conform"
TASKS, SAMPLES, PER_BATCH = 3, 3, 4  # 2 groups per batch: 2 batches

# What the k-th start of each task's harness does: a reward for the evaluator, or a failure.
DRAWS = {
    "t0": ["1", "0.5", "judge-down"],
    "t1": ["1", "0", "fail-after-call"],
    "t2": ["fail-before-call", "1", "0", "evaluator-error"],
}

HARNESS = textwrap.dedent(
    """
    import fcntl, hashlib, json, os, re, sys, urllib.request
    # the place's own: the machine's, the image's (its ENV), the cluster's (Service variables, the pod's name)
    MACHINE = {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "SSL_CERT_FILE", "SSL_CERT_DIR", "PWD", "OLDPWD",
               "SHLVL", "_", "HOSTNAME", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PIP_DISABLE_PIP_VERSION_CHECK"}
    own = [(os.environ["OPENAI_API_KEY"], "<secret>"), (os.getcwd(), "<workdir>"), (os.environ["HOME"], "<home>")]

    def seen(value):
        value = re.sub(r"http://127[.]0[.]0[.]1:[0-9]+/s/[A-Za-z0-9._-]+", "<session endpoint>", value)
        for real, name in own:
            value = value.replace(real, name)
        return value

    env = {k: seen(v) for k, v in sorted(os.environ.items()) if k not in MACHINE and not k.startswith("KUBERNETES_")}
    json.dump(env, open("seen-env.json", "w"), sort_keys=True)
    digest = hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]
    counters, draws, task = sys.argv[1:4]
    if os.path.isdir(counters):  # this machine's (`tracefleet run`: the harness reaches only its proxy)
        with open(os.path.join(counters, task), "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            k = len(f.read())
            f.write("x")
    else:  # a pod's: the engine's address
        k = int(urllib.request.urlopen(f"{draws}/{task}", timeout=30).read())
    draw = json.loads(os.environ["CONFORM_DRAWS"])[task][k]
    if draw == "fail-before-call":
        sys.exit(4)
    req = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": os.environ["OPENAI_MODEL"], "max_tokens": 8,
                         "messages": [{"role": "user", "content": f"{task}: draw {k}, env {digest}"}]}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    json.load(urllib.request.urlopen(req, timeout=60))
    if draw == "fail-after-call":
        sys.exit(3)
    open("answer.txt", "w").write(draw)
    """
)
# "judge-down": the evaluator plays a grading service that is down for this session (exit 75: it could not
# judge). The draw tells it which session only because rows are compared by draw; in a job nothing the agent
# writes can make a sound judge say so.
EVALUATOR = textwrap.dedent(
    """
    import json, sys
    draw = open("answer.txt").read().strip()
    if draw == "judge-down":
        print("grading service down", file=sys.stderr)
        sys.exit(75)
    print(json.dumps({"reward": "nan" if draw == "evaluator-error" else float(draw),
                      "harness_env": json.load(open("seen-env.json"))}))
    """
)
DRAWS_PATH = "/conform-draws"


class DrawingEngine:
    """The engine as the job names it: every request forwarded to the scripted engine, and GET DRAWS_PATH/<task>
    counting the starts of each task's harness in a pod (the k-th start reads k). At the engine's address because a
    harness pod reaches nothing else beyond its sidecar (its NetworkPolicy). `tracefleet run`'s harness reaches only
    its proxy (a loopback-only network namespace) but shares this machine's files: it counts in `counters`, a
    folder no pod has. One command line for both drivers, so one plan."""

    def __init__(self, engine: Any, host: str, counters: Path) -> None:
        self.engine, self.model, self.counters = engine, engine.model, counters
        counters.mkdir(exist_ok=True)
        self.counts: Counter[str] = Counter()
        lock = threading.Lock()
        target = engine.url.split("://", 1)[1]
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
                self.send_response(status)
                for key, value in headers:
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _forward(self) -> None:
                if self.command == "GET" and self.path.startswith(DRAWS_PATH + "/"):
                    with lock:
                        task = self.path.rsplit("/", 1)[1]
                        k = outer.counts[task]
                        outer.counts[task] += 1
                    self._reply(200, [("Content-Type", "text/plain")], str(k).encode())
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection(target, timeout=300)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    r = conn.getresponse()
                    self._reply(r.status, r.getheaders(), r.read())
                finally:
                    conn.close()

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.draws = self.url + DRAWS_PATH
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def starts(self) -> dict[str, int]:
        """How often each task's harness started since the last call, in either driver: sessions plus retries."""
        here = Counter({f.name: len(f.read_text()) for f in self.counters.iterdir()})
        for f in self.counters.iterdir():
            f.unlink()
        out, self.counts = dict(sorted((self.counts + here).items())), Counter()
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def drawing_engine(node: Any, host_engine: Any, tmp_path: Path) -> Iterator[DrawingEngine]:
    engine = DrawingEngine(host_engine, node.host, tmp_path / "counters")
    yield engine
    engine.close()


# a preset default the job overrides (the command preset sets NO_COLOR=1), and a variable that routes the
# harness, which stays the session's
USER_ENV = {"NO_COLOR": "0", "OPENAI_BASE_URL": "http://192.0.2.1:9/v1"}


def manifest(engine: DrawingEngine, output: str) -> dict[str, Any]:
    """The job, the same for both drivers: the tracefleet image's python runs the harness and the evaluator."""
    return {
        "apiVersion": "tracefleet.io/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": JOB},
        "spec": {
            "inference": {"external": {"baseUrl": engine.url, "model": engine.model}, "capture": {"mode": "server"},
                          # stated, so both drivers' proxies are compared on more than defaults
                          "sampling": {"temperature": 1.0}, "engineTimeouts": {"interTokenSeconds": 120}},
            "harness": {"preset": "command", "image": TRACEFLEET_IMAGE,
                        "command": ["python", "-c", HARNESS, str(engine.counters), engine.draws, "{prompt}"],
                        "env": {"CONFORM_DRAWS": json.dumps(DRAWS), **USER_ENV}, "sessionTimeoutSeconds": 120},
            "tasks": {"inline": [{"id": f"t{i}", "prompt": f"t{i}"} for i in range(TASKS)], "samplesPerTask": SAMPLES},
            "evaluator": {"preset": "command", "command": ["python", "-c", EVALUATOR], "timeoutSeconds": 60},
            "output": {"uri": output, "credentialsSecretRef": {"name": CREDENTIALS_SECRET}, "tracesPerBatch": PER_BATCH},
            "parallelism": 3,
            "maxRetries": 2,
        },
    }


# ---------------------------------------------------------------- what a trainer reads

COMPARED = ("task_id", "group_id", "job", "harness", "model", "builder", "reward", "evaluator_reward", "outcome",
            "fail_closed_reasons", "outcome_kind", "finish_reasons", "num_tokens", "num_trainable", "tokens", "loss_mask", "logprobs")


# what differs between any two runs of a session: when, how long, and the random call ids
TIMED = ("timings", "stats")


def metadata(row: dict[str, Any]) -> dict[str, Any]:
    """A row's trace metadata but its timings, and without what pairs it with one session (compared apart)."""
    meta = {k: v for k, v in json.loads(row["metadata_json"]).items()
            if k not in (*TIMED, "session_id", "trace_id", "sample_index")}
    meta["extra"] = {k: v for k, v in meta["extra"].items() if k != "timings"}
    meta["diagnostics"] = [{k: v for k, v in f.items() if k != "call_id"} for f in meta["diagnostics"]]
    if meta["extra"].get("evaluation"):
        meta["extra"]["evaluation"] = {k: v for k, v in meta["extra"]["evaluation"].items() if k != "duration_s"}
    return meta


def read_batches(reader: BatchReader) -> list[dict[str, Any]]:
    """Every sealed row, with its advantage as a trainer reads it (None: left out of training)."""
    out = []
    for seq in reader.seqs():
        batch = reader.read(seq)
        trained = {t: a for t, a, k in zip(batch.table.column("trace_id").to_pylist(), batch.advantages(),
                                           batch.trained(), strict=True) if k}
        rows = batch.training_table(include_infrastructure=True).to_pylist()
        for row in rows:
            adv = trained.get(row["trace_id"])
            row["advantage"] = None if adv is None else round(float(adv), 5)
            row["spans"] = [{k: v for k, v in s.items() if k != "call_id"} for s in row["spans"]]
            row["metadata"] = metadata(row)
        out.append({"seq": seq, "rows": rows, "outcome_kinds": dict(batch.manifest.outcome_kinds)})
    return out


def by_group(batches: list[dict[str, Any]]) -> dict[str, list[tuple]]:
    groups: dict[str, list[tuple]] = {}
    for b in batches:
        for r in b["rows"]:
            key = tuple((c, json.dumps(r[c], sort_keys=True)) for c in (*COMPARED, "spans", "advantage", "metadata"))
            groups.setdefault(r["group_id"], []).append(key)
    return {g: sorted(rows) for g, rows in groups.items()}


def flat(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flat(item, f"{path}.{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in flat(item, f"{path}[{i}]").items()}
    return {path: value}


def differences(a: dict[str, list[tuple]], b: dict[str, list[tuple]]) -> list[str]:
    """What tells two drivers' rows apart: per group, the columns of the rows one has and the other not."""
    out = []
    for g in sorted({*a, *b}):
        left = [r for r in a.get(g, []) if r not in b.get(g, [])]
        right = [r for r in b.get(g, []) if r not in a.get(g, [])]
        for x, y in zip(left, right):
            for (cx, vx), (_, vy) in zip(x, y):
                fx, fy = flat(json.loads(vx)), flat(json.loads(vy))
                out += [f"{g} {cx}{k}: {fx.get(k)!r:.300} != {fy.get(k)!r:.300}" for k in sorted({*fx, *fy}) if fx.get(k) != fy.get(k)]
        if len(left) != len(right):
            out.append(f"{g}: {len(left)} rows against {len(right)}")
    return out


def sessions_by_group(batches: list[dict[str, Any]]) -> dict[str, list[tuple[str, int]]]:
    """Each group's (session id, sample index) pairs: one id format in both drivers, `<job>-s<index>`."""
    groups: dict[str, list[tuple[str, int]]] = {}
    for b in batches:
        for r in b["rows"]:
            groups.setdefault(r["group_id"], []).append((r["session_id"], r["sample_index"]))
    return {g: sorted(pairs) for g, pairs in groups.items()}


def harness_envs(batches: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The environments the harness reported, as the evaluator's output in the trace metadata."""
    return [r["metadata"]["extra"]["evaluation"]["details"]["harness_env"] for b in batches for r in b["rows"]
            if (r["metadata"]["extra"].get("evaluation") or {}).get("details", {}).get("harness_env")]


def assert_whole_groups(batches: list[dict[str, Any]]) -> None:
    seen: dict[str, int] = {}
    for b in batches:
        samples: dict[str, set[int]] = {}
        for r in b["rows"]:
            samples.setdefault(r["group_id"], set()).add(r["sample_index"])
        for g, s in samples.items():
            assert s == set(range(SAMPLES)), f"batch {b['seq']}: group {g} has samples {s}"
            assert g not in seen, f"group {g} in batches {seen[g]} and {b['seq']}"
            seen[g] = b["seq"]
    assert sorted(seen) == [f"{JOB}/t{i}" for i in range(TASKS)]


def assert_expected_semantics(batches: list[dict[str, Any]], driver: str) -> None:
    """What the job must mean, whichever driver ran it."""
    assert len(batches) == semantics.batch_count(TASKS, PER_BATCH, SAMPLES) == 2
    assert_whole_groups(batches)
    rows = [r for b in batches for r in b["rows"]]
    assert len(rows) == TASKS * SAMPLES
    summary = Counter((r["task_id"], r["reward"], r["outcome"], tuple(r["fail_closed_reasons"]), r["outcome_kind"])
                      for r in rows)
    assert summary == Counter({
        ("t0", 1.0, "ok", (), "ok"): 1, ("t0", 0.5, "ok", (), "ok"): 1,
        ("t0", 0.0, "fail_closed", ("evaluator_unavailable",), "infrastructure"): 1,  # its evaluator could not run
        ("t1", 1.0, "ok", (), "ok"): 1, ("t1", 0.0, "ok", (), "ok"): 1,
        ("t1", 0.0, "fail_closed", ("session_error:harness", "evaluator_missing"), "policy"): 1,  # failed after its call
        ("t2", 1.0, "ok", (), "ok"): 1, ("t2", 0.0, "ok", (), "ok"): 1,
        ("t2", 0.0, "fail_closed", ("evaluator_error",), "policy"): 1,
    }), (driver, summary)
    assert all(r["num_trainable"] > 0 for r in rows)  # every sealed session made its model call
    # the infrastructure's sample is left out of training, the policy's are trained on
    assert [r["advantage"] is None for r in rows].count(True) == 1
    assert all((r["advantage"] is None) == (r["outcome_kind"] == "infrastructure") for r in rows)
    for g in {r["group_id"] for r in rows}:
        adv = [r["advantage"] for r in rows if r["group_id"] == g and r["advantage"] is not None]
        assert any(a > 0 for a in adv) and any(a < 0 for a in adv), (g, adv)
        assert abs(sum(adv)) < 1e-3
    # t0's advantages are those of the group without the sample its evaluator could not judge
    t0 = sorted((r["reward"], r["advantage"]) for r in rows if r["task_id"] == "t0" and r["advantage"] is not None)
    assert t0 == [(0.5, -1.0), (1.0, 1.0)], (driver, t0)
    # counted in the manifests
    kinds: Counter[str] = Counter()
    for b in batches:
        kinds.update(b["outcome_kinds"])
    assert kinds == {"ok": 6, "policy": 2, "infrastructure": 1}, (driver, kinds)


# ---------------------------------------------------------------- the plans

# Where a Harbor task's folder is: a folder on this machine for `tracefleet run`, the task source's URI on a cluster
# (the evaluator Job's fetch step reads the task's tests again from there). A place's, not the plan's meaning.
PLACE_FIELDS = {"task": {"harbor": {"folder"}}}


def local_plans(job_file: Path, tmp: Path, engine: Any) -> tuple[list[SessionPlan], ProxyPlan]:
    """The plans `tracefleet run` builds for the job file: its own planning (LocalRun.plans over its tasks, before this
    machine's sandbox options and a Harbor task's image are added; LocalRun.proxy_plan for its engine)."""
    from tracefleet.runner.local import LocalOptions, LocalRun, job_tasks

    run = LocalRun(LocalOptions(job_path=job_file))
    return (run.plans(job_tasks(run.job, run.base_dir, tmp / "plan-sources"), engine.model),
            run.proxy_plan(engine.url, engine.model))


def assert_same_plans(local: tuple[list[SessionPlan], ProxyPlan], cluster: Installed, job: str, tmp: Path) -> None:
    """The SessionPlan each first-attempt harness pod was given (its plan files, mounted from its ConfigMaps, read as
    the pod program reads them) equals the one `tracefleet run` built for that session, field by field; and so does
    the ProxyPlan its sidecar was given to the one `tracefleet run`'s in-process proxy ran."""
    local, proxy = local
    pods = cluster.core.list_namespaced_pod(NAMESPACE, label_selector=n.job_selector(job, n.COMPONENT_HARNESS)).items
    config_maps = cluster_config_maps(cluster.core, NAMESPACE)
    shipped: dict[int, SessionPlan] = {}
    for pod in pods:
        if pod.metadata.labels[n.LABEL_ATTEMPT] != "0":
            continue
        spec = cluster.core.api_client.sanitize_for_serialization(pod)["spec"]
        program = "session" if len(spec["containers"]) > 1 else "harness"  # a Harbor task's pod: the session program
        plan = reads(HarnessEnv, spec, program, config_maps, tmp / pod.metadata.name).plan
        shipped[plan.index] = plan
        sidecar = reads(ProxySidecarEnv, spec, "proxy", config_maps, tmp / pod.metadata.name / "proxy").plan
        assert sidecar.session_id == plan.session_id
        here, there = flat(proxy.model_dump(mode="json")), flat(sidecar.proxy.model_dump(mode="json"))
        assert here == there, [f"{plan.session_id} proxy{k}: {here.get(k)!r} != {there.get(k)!r}"
                               for k in sorted({*here, *there}) if here.get(k) != there.get(k)]
    assert sorted(shipped) == [p.index for p in local]
    for plan in local:
        here = flat(plan.model_dump(mode="json", exclude=PLACE_FIELDS))
        there = flat(shipped[plan.index].model_dump(mode="json", exclude=PLACE_FIELDS))
        assert here == there, [f"{plan.session_id}{k}: {here.get(k)!r} != {there.get(k)!r}"
                               for k in sorted({*here, *there}) if here.get(k) != there.get(k)]


def test_local_and_node_runs_give_a_trainer_the_same_batches(node: Any, installed: Installed, cluster_s3: Any,
                                                            drawing_engine: DrawingEngine, tmp_path: Path) -> None:
    engine, s3 = drawing_engine, cluster_s3
    prefix = f"s3://{installed.bucket}/conform-{uuid.uuid4().hex[:8]}"
    creds = s3.env()

    # ---- tracefleet run
    local, local_s = run_local(manifest(engine, f"{prefix}/local"), tmp_path, env=creds, timeout_s=400)
    assert local.returncode == 0, local.stdout + local.stderr
    local_starts = engine.starts()
    assert "retry 1/2" in local.stderr, local.stderr  # the failure before the model call was retried

    # ---- the operator on the node: kubectl apply, the kubelet runs every pod
    # a trainer follows the cluster's batches while the job runs
    cluster_reader = BatchReader(f"{prefix}/cluster", JOB, consumer="trainer", **s3.bucket_options())
    trained: list[dict[str, Any]] = []

    def trainer() -> None:
        for batch in cluster_reader.follow(poll_s=0.5, timeout_s=400):
            t = batch.tensors()
            trained.append({"groups": set(batch.table.column("group_id").to_pylist()),
                            "advantages": t["sequence_advantages"].numpy().copy(), "loss_tokens": float(t["loss_mask"].sum())})
            cluster_reader.commit(batch)
            if len(trained) == semantics.batch_count(TASKS, PER_BATCH, SAMPLES):
                return

    follower = threading.Thread(target=trainer, daemon=True)
    follower.start()
    try:
        status, _ = apply_job(node, installed, s3, manifest(engine, f"{prefix}/cluster"))
        follower.join(60)
        assert status["phase"] == "Succeeded", status
        print(f"local run {local_s:.1f} s")
        # every child pod ran on the node, as the kubelet reported it: the failed sessions' harness pods Failed
        children = assert_children_ran(node, installed, JOB, all_succeeded=False)
        failed = sorted(pod.metadata.labels[n.LABEL_COMPONENT] for name, pod in children.items()
                        if installed.pods.phases[name][-1] == "Failed")
        assert failed.count(n.COMPONENT_HARNESS) == 2, failed  # fail-before-call (then retried), fail-after-call
        assert n.COMPONENT_SEALER not in failed, failed
        # ---- the plans: each session's, as each driver built it (tracefleet.contract.plan.plan_sessions in both)
        assert_same_plans(local_plans(tmp_path / "job.yaml", tmp_path, engine), installed, JOB, tmp_path / "shipped")
        pods = installed.core.list_namespaced_pod(NAMESPACE, label_selector=n.job_selector(JOB, n.COMPONENT_HARNESS)).items
    finally:
        installed.delete(JOB)
    # the sample whose evaluator could not run, counted by both drivers
    assert status["counters"]["infrastructure"] == 1, status
    assert "ok 6, the policy's failures 2, the infrastructure's 1" in local.stdout, local.stdout

    # maxRetries, the same in both drivers: the failure before the first model call ran again (t2: one more
    # start), the failure after it did not (t1: three starts)
    assert engine.starts() == local_starts == {"t0": 3, "t1": 3, "t2": 4}
    attempts = Counter(int(p.metadata.labels[n.LABEL_ATTEMPT]) for p in pods)
    assert attempts == {0: 9, 1: 1}, attempts

    # ---- what a trainer reads from either bucket
    local_batches = read_batches(BatchReader(f"{prefix}/local", JOB, **s3.bucket_options()))
    cluster_batches = read_batches(BatchReader(f"{prefix}/cluster", JOB, **s3.bucket_options()))
    assert_expected_semantics(local_batches, "local")
    assert_expected_semantics(cluster_batches, "cluster")
    assert sessions_by_group(cluster_batches) == sessions_by_group(local_batches) == {
        f"{JOB}/t{t}": [(f"{JOB}-s{t * SAMPLES + s}", s) for s in range(SAMPLES)] for t in range(TASKS)}
    assert by_group(cluster_batches) == by_group(local_batches), "\n".join(differences(by_group(cluster_batches),
                                                                                     by_group(local_batches)))
    # the environment the harness saw: the same from both drivers; the job's env over the preset's default, the
    # session's endpoint over the job's
    local_envs, cluster_envs = harness_envs(local_batches), harness_envs(cluster_batches)
    assert len(local_envs) == 6 and sorted(map(json.dumps, local_envs)) == sorted(map(json.dumps, cluster_envs))
    env = local_envs[0]
    assert env["NO_COLOR"] == "0" and env["CONFORM_DRAWS"] == json.dumps(DRAWS), env
    assert env["OPENAI_BASE_URL"] == "<session endpoint>/v1" and env["OPENAI_API_KEY"] == "<secret>", env
    assert env["HOME"] == "<home>" and not any(k.startswith("TRACEFLEET_") and k not in (
        "TRACEFLEET_BASE_URL", "TRACEFLEET_API_KEY", "TRACEFLEET_MODEL", "TRACEFLEET_PROMPT", "TRACEFLEET_PROMPT_FILE",
        "TRACEFLEET_WORKDIR")
        for k in env), env
    assert sorted(len(b["rows"]) for b in cluster_batches) == sorted(len(b["rows"]) for b in local_batches) == [3, 6]
    # the harness that failed after its call: its pod Failed, and still `tracefleet run --in-pod` kept what it did
    # (the change it made, its result with the harness's own exit code) and the sidecar uploaded it
    (failed_row,) = [r for b in cluster_batches for r in b["rows"] if "session_error:harness" in r["fail_closed_reasons"]]
    artifacts = layout.artifacts_prefix(JOB, int(failed_row["session_id"].rsplit("-s", 1)[1]))
    cluster = open_bucket(f"{prefix}/cluster", **s3.bucket_options())
    result = json.loads(cluster.get(artifacts + layout.RESULT))
    assert (result["status"], result["stage"], result["harness_exit_code"]) == ("error", "harness", 3), result
    assert "seen-env.json" in cluster.get(artifacts + layout.PATCH).decode()

    # the cluster's batches as a trainer consumed them: whole groups, GRPO advantages that are not all zero
    assert len(trained) == 2 and sorted(len(t["groups"]) for t in trained) == [1, 2]
    assert set().union(*(t["groups"] for t in trained)) == {f"{JOB}/t{i}" for i in range(TASKS)}
    assert all(np.abs(t["advantages"]).max() > 0.5 and t["loss_tokens"] > 0 for t in trained)


# ---------------------------------------------------------------- a Harbor job

HARBOR_JOB = "conform-harbor"
HARBOR_SAMPLES = 2
HARBOR_TESTS = {
    # the agent's answer solves it: reward.txt
    "answer": ANSWER_TEST_SH,
    # it does not: reward.json with a second metric (the answer was written, in the task's /app)
    "metrics": '#!/bin/bash\nif [ "$(cat /app/answer.txt 2>/dev/null)" = 41 ]; then r=1; else r=0; fi\n'
               'if [ -s /app/answer.txt ]; then a=1; else a=0; fi\n'
               'printf \'{"reward": %s, "answered": %s}\\n\' $r $a > /logs/verifier/reward.json\n',
}


def harbor_manifest(engine: Any, tasks: str, output: str) -> dict[str, Any]:
    """The Harbor job, the same for both drivers: the harness image's bundle (its Node.js) runs the agent."""
    return {
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": HARBOR_JOB},
        "spec": {
            "inference": {"external": {"baseUrl": engine.url, "model": engine.model}, "capture": {"mode": "server"}},
            "harness": {"preset": "command", "image": HARNESS_IMAGE, "sessionTimeoutSeconds": 120,
                        "command": ["node", "-e", ANSWER_AGENT_JS, "{base_url_v1}", "{api_key}", "{model}", "{prompt}"]},
            "tasks": {"harbor": {"uri": tasks}, "samplesPerTask": HARBOR_SAMPLES},
            "output": {"uri": output, "credentialsSecretRef": {"name": CREDENTIALS_SECRET},
                       "tracesPerBatch": HARBOR_SAMPLES},
            "parallelism": 2,
        },
    }


def test_a_harbor_job_gives_a_trainer_the_same_batches_from_both_drivers(node: Any, installed: Installed,
                                                                        cluster_s3: Any, host_engine: Any,
                                                                        container_runtime: Any, tmp_path: Path,
                                                                        monkeypatch: Any) -> None:
    """Each harness pod runs its task's own image on the node (the base image, loaded into containerd)."""
    s3 = cluster_s3
    node.load_image(container_runtime, BASE_IMAGE)
    host_engine.configure(no_tools_text="42")
    prefix = f"s3://{installed.bucket}/conform-harbor-{uuid.uuid4().hex[:8]}"
    creds = s3.env()
    source = open_bucket(f"{prefix}/tasks", **s3.bucket_options())
    for name, test_sh in HARBOR_TESTS.items():
        files = {"task.toml": answer_task_toml(f'difficulty = "{name}-level"'), "tests/test.sh": test_sh,
                 "instruction.md": f"Write the answer to answer.txt ({name}).\n"}
        for rel, text in files.items():
            source.put(f"{name}/{rel}", text.encode())
    tasks = f"{prefix}/tasks"
    try:
        local, local_s = run_local(harbor_manifest(host_engine, tasks, f"{prefix}/local"), tmp_path, env=creds,
                                   timeout_s=300)
        assert local.returncode == 0, local.stdout + local.stderr
        print(f"harbor job: local run {local_s:.1f} s")
        try:
            status, _ = apply_job(node, installed, s3, harbor_manifest(host_engine, tasks, f"{prefix}/cluster"),
                                  timeout_s=300)
            assert status["phase"] == "Succeeded", status
            children = assert_children_ran(node, installed, HARBOR_JOB)
            harness = [p for p in children.values() if p.metadata.labels[n.LABEL_COMPONENT] == n.COMPONENT_HARNESS]
            assert {c.image for p in harness for c in p.spec.containers} >= {BASE_IMAGE}  # the task's own image
            for key, value in creds.items():  # the local planner reads the task source as `tracefleet run` did
                monkeypatch.setenv(key, value)
            plans = local_plans(tmp_path / "job.yaml", tmp_path, host_engine)
            assert [(p.task.id, p.harness.timeout_s, p.evaluator.type) for p in plans[0]] == [
                ("answer", 120, "harbor"), ("answer", 120, "harbor"), ("metrics", 120, "harbor"),
                ("metrics", 120, "harbor")]
            assert_same_plans(plans, installed, HARBOR_JOB, tmp_path / "shipped")
        finally:
            installed.delete(HARBOR_JOB)
    finally:
        host_engine.reset()

    local_batches = read_batches(BatchReader(f"{prefix}/local", HARBOR_JOB, **s3.bucket_options()))
    cluster_batches = read_batches(BatchReader(f"{prefix}/cluster", HARBOR_JOB, **s3.bucket_options()))
    for batches in (local_batches, cluster_batches):
        rows = [r for b in batches for r in b["rows"]]
        summary = Counter((r["task_id"], r["reward"], r["outcome"], r["num_trainable"] > 0) for r in rows)
        assert summary == {("answer", 1.0, "ok", True): 2, ("metrics", 0.0, "ok", True): 2}, summary
        for r in rows:
            evaluation = r["metadata"]["extra"]["evaluation"]
            assert evaluation["metrics"] == ({"reward": 1.0} if r["task_id"] == "answer"
                                             else {"reward": 0.0, "answered": 1.0}), evaluation
    assert sessions_by_group(cluster_batches) == sessions_by_group(local_batches)
    assert by_group(cluster_batches) == by_group(local_batches), "\n".join(differences(by_group(cluster_batches),
                                                                                     by_group(local_batches)))
    # the session's patch the diagnostics read: the agent's change in the task's /app, from the pod's change set as
    # from the local container (an empty one flagged the cluster's solved rows as success without work)
    cluster = open_bucket(f"{prefix}/cluster", **s3.bucket_options())
    patch = cluster.get(layout.artifacts_prefix(HARBOR_JOB, 0) + layout.PATCH).decode()
    assert "diff --git a/answer.txt b/answer.txt" in patch and "+42" in patch, patch
    # the agent ran in the task's /app, in the task container, and its change set came back with the artifacts
    artifacts = layout.artifacts_prefix(HARBOR_JOB, 0)
    assert cluster.get(artifacts + "harness.stdout").decode().strip() == "answered in /app"
    assert {artifacts + name for name in (ti.CHANGES, ti.DELETED)} <= {o.key for o in cluster.list(artifacts)}
