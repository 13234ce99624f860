"""The reconcile as its named steps (tracefleet.operator.reconcile.STEPS), each run on its own against the real API
server (KWOK nodes: the pods never start): what each step finds, creates and decides, and where a pass ends early.

The job's one task has a prompt of the schema's most characters (262,144, each 4 UTF-8 bytes): its pods' plans go in
ConfigMaps the API server accepts (at most 1 MiB each), split over several."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tracefleet.contract.plan_files import SESSION_PLAN
from tracefleet.operator import names as n
from tracefleet.operator import status as st
from tracefleet.operator.config import OperatorConfig
from tracefleet.operator.kube import Kube
from tracefleet.operator.reconcile import STEPS, Pass, Reconciler

REPO = Path(__file__).resolve().parents[2]
PROMPT = "\U0001F600" * 262144
JOB = """
apiVersion: tracefleet.io/v1alpha1
kind: RolloutJob
metadata: {{name: steps, namespace: {ns}, uid: 5e1f0c2a-steps, generation: 1}}
spec:
  inference: {{external: {{baseUrl: "{engine}", model: "{model}"}}, capture: {{mode: server}}}}
  harness: {{command: ["python", "agent.py"], image: reg.local/agent:1}}
  tasks: {{inline: [{{id: t1, prompt: "p"}}], samplesPerTask: 2}}
  evaluator: {{preset: hook, entryPoint: "grader:score"}}
  output: {{uri: "s3://traces/runs"}}
  parallelism: 2
"""
NOW = datetime(2026, 11, 28, tzinfo=timezone.utc)


def job_body(ns: str, engine: Any, **spec: Any) -> dict[str, Any]:
    body = yaml.safe_load(JOB.format(ns=ns, engine=engine.url, model=engine.model))
    body["spec"]["tasks"]["inline"][0]["prompt"] = PROMPT
    body["spec"].update(spec)
    return body


def namespace(kube: Any, name: str) -> str:
    assert kube.kubectl("create", "namespace", name).returncode == 0
    return name


def stored(kube: Any, body: dict[str, Any]) -> dict[str, Any]:
    """`body` with the uid of the RolloutJob the API server stored for it (its prompt cut short: the object itself
    holds the schema's most only within the API server's request limit): the garbage collector keeps the children
    of a job that exists."""
    assert kube.kubectl("apply", "-f", str(REPO / "crds")).returncode == 0
    assert kube.kubectl("wait", "--for=condition=established", "--timeout=60s",
                        f"crd/{n.PLURAL}.{n.GROUP}").returncode == 0
    short = {**body, "spec": {**body["spec"], "tasks": {**body["spec"]["tasks"], "inline": [{"id": "t1", "prompt": "p"}]}}}
    meta = {k: v for k, v in body["metadata"].items() if k not in ("uid", "generation")}
    made = client.CustomObjectsApi(kube.api_client()).create_namespaced_custom_object(
        n.GROUP, n.VERSION, meta["namespace"], n.PLURAL, {**short, "metadata": meta})
    return {**body, "metadata": {**body["metadata"], "uid": made["metadata"]["uid"]}}


def test_each_step_of_a_pass_in_order(kube: Any, scripted_engine: Any) -> None:
    ns = namespace(kube, "steps")
    core = client.CoreV1Api(kube.api_client())
    r = Reconciler(Kube(kube.api_client()), OperatorConfig(proxy_image="reg.local/tracefleet:1"))
    ps = Pass(body=stored(kube, job_body(ns, scripted_engine)), now=NOW, old=st.RolloutJobStatus())

    assert r.read_job(ps) and ps.job.name == "steps"
    assert r.check_immutable(ps) and not ps.checked.refused and ps.checked.record  # the spec's hash, first seen
    assert r.validate(ps) and ps.harbor is None and ps.res.status is None
    assert r.read_plans(ps) and [p.session_id for p in ps.plans] == ["steps-s0", "steps-s1"]
    assert ps.budget == r.cfg.max_creates_per_reconcile
    assert r.observe_inference(ps) and ps.inference.status == "True"  # the engine answers /v1/models
    assert r.observe_sessions(ps) and ps.decided.need_pod == [(0, 0), (1, 0)] and ps.decided.need_eval == []
    assert r.suspend(ps)  # not suspended: nothing deleted
    assert r.network_policies(ps)
    names = {p.metadata.name for p in client.NetworkingV1Api(kube.api_client()).list_namespaced_network_policy(ns).items}
    assert {"steps-harness", "steps-evaluator", "steps-sealer"} <= names

    budget = ps.budget
    assert r.start_sessions(ps) and ps.created_pods == 2 and ps.budget == budget - 2
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(ns).items}
    assert set(pods) == {"steps-s0-a0", "steps-s1-a0"}
    config_maps = {c.metadata.name: c for c in core.list_namespaced_config_map(ns).items if c.metadata.name.startswith("steps-")}
    mine = sorted(name for name in config_maps if name.startswith("steps-s0-a0-plan-"))
    assert len(mine) > 1  # the plan is over a ConfigMap's 1 MiB: split, and the API server took every part
    plan = "".join(config_maps[name].data[key] for name in mine for key in sorted(config_maps[name].data)
                   if key.startswith(SESSION_PLAN))
    assert PROMPT in plan
    assert all(c.metadata.owner_references[0].name == "steps" for c in config_maps.values())  # they go with the job

    assert r.seal(ps) and ps.batches == [] and not ps.unsealed  # nothing finished: no sealer
    assert r.report(ps) and ps.res.status is not None
    assert (ps.res.status.counters.total, ps.res.status.counters.running) == (2, 2)
    assert STEPS[-1] == "report" and all(callable(getattr(r, step)) for step in STEPS)


def test_a_pass_ends_at_the_step_that_says_so(kube: Any, scripted_engine: Any) -> None:
    ns = namespace(kube, "steps-end")
    r = Reconciler(Kube(kube.api_client()))

    body = job_body(ns, scripted_engine)
    body["spec"]["parallelism"] = -1  # what the CRD refuses: reported, not crash-looped
    ps = Pass(body=body, now=NOW, old=st.RolloutJobStatus())
    assert not r.read_job(ps) and ps.res.status is not None and ps.res.status.phase == st.FAILED

    ps = Pass(body=job_body(ns, scripted_engine, managedBy="kueue.x-k8s.io/multikueue"), now=NOW,
              old=st.RolloutJobStatus())
    assert not r.read_job(ps) and ps.res.status is None  # another controller's

    ps = Pass(body=job_body(ns, scripted_engine), now=NOW, old=st.RolloutJobStatus(phase=st.SUCCEEDED))
    assert r.read_job(ps) and not r.check_immutable(ps) and ps.res.status is None  # finished: only its TTL is left

    body = job_body(ns, scripted_engine)
    del body["spec"]["harness"]["image"]
    ps = Pass(body=body, now=NOW, old=st.RolloutJobStatus())
    assert r.read_job(ps) and r.check_immutable(ps) and not r.validate(ps)
    failed = next(c for c in ps.res.status.conditions if c.type == st.COND_FAILED)
    assert failed.reason == st.REASON_INVALID_SPEC and "spec.harness.image is required" in failed.message
    assert not client.CoreV1Api(kube.api_client()).list_namespaced_pod(ns).items
