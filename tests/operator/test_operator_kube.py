"""The kube helpers against the real API server: what a refused child, missing RBAC and an unreachable
API server mean for the reconcile (retry intent in operator/kube.py, acted on by handlers.run_pass)."""

from __future__ import annotations

import kopf
import pytest
import yaml
from kubernetes import client

from fixtures.controlplane import free_port
from tracefleet.operator import names as n
from tracefleet.operator import status as st
from tracefleet.operator.handlers import run_pass
from tracefleet.operator.kube import API_RETRY_DELAY_S, FORBIDDEN_RETRY_DELAY_S, Kube
from tracefleet.operator.reconcile import Reconciler

JOB = """
apiVersion: tracefleet.io/v1alpha1
kind: RolloutJob
metadata:
  name: refused
  namespace: {ns}
  uid: 0b7d2c1e-refused
  generation: 1
  # a priority class name the API server cannot accept (not a DNS subdomain), which the RolloutJob
  # schema does not check: the inference Deployment built from it is refused
  labels: {{kueue.x-k8s.io/priority-class: Not_A_Name}}
spec:
  inference: {{managed: {{model: Qwen/Qwen3-4B}}}}
  harness: {{preset: codex, image: ghcr.io/acme/codex:1}}
  tasks: {{inline: [{{id: t1, prompt: "fix the bug"}}], samplesPerTask: 2}}
  output: {{uri: "s3://traces/runs"}}
"""


def test_a_child_the_api_server_refuses_fails_the_job(kube) -> None:
    ns = "refused-child"
    assert kube.kubectl("create", "namespace", ns).returncode == 0
    reconciler = Reconciler(Kube(kube.api_client()))
    body = yaml.safe_load(JOB.format(ns=ns))
    res = run_pass(reconciler, body)
    assert res.status is not None
    status = st.status_patch(res.status)  # what is written to the status subresource
    assert status["phase"] == st.FAILED
    failed = next(c for c in status["conditions"] if c["type"] == st.COND_FAILED)
    assert failed["status"] == "True" and failed["reason"] == st.REASON_CHILD_REJECTED
    assert failed["message"].startswith(f"create deployment {ns}/{n.inference_name('refused')}: 422 ")
    assert "priorityClassName" in failed["message"]
    assert [(t, r) for t, r, _ in res.events] == [(st.WARNING, st.REASON_CHILD_REJECTED)]
    # the next pass sees a finished job: it creates nothing and reports nothing new
    again = run_pass(reconciler, {**body, "status": status})
    assert again.status is None and again.events == []
    assert client.CoreV1Api(kube.api_client()).list_namespaced_pod(ns).items == []


def test_missing_rbac_is_retried_later(kube) -> None:
    ns = "no-rbac"
    assert kube.kubectl("create", "namespace", ns).returncode == 0
    assert kube.kubectl("-n", ns, "create", "serviceaccount", "nobody").returncode == 0
    token = kube.kubectl("-n", ns, "create", "token", "nobody").stdout.strip()
    cfg = client.Configuration(host=kube.server, api_key={"authorization": f"Bearer {token}"})
    cfg.ssl_ca_cert = str(kube.pki.ca_cert)
    with pytest.raises(kopf.TemporaryError) as err:
        Kube(client.ApiClient(cfg)).list_pods(ns, n.job_selector("any"))
    assert err.value.delay == FORBIDDEN_RETRY_DELAY_S
    assert "list pods no-rbac" in str(err.value) and "403" in str(err.value) and "forbidden" in str(err.value)


def test_an_unreachable_api_server_is_retried_soon() -> None:
    cfg = client.Configuration(host=f"http://127.0.0.1:{free_port()}")
    cfg.retries = False
    with pytest.raises(kopf.TemporaryError) as err:
        Kube(client.ApiClient(cfg)).get_deployment("team", "demo-inference")
    assert err.value.delay == API_RETRY_DELAY_S and "API server unreachable" in str(err.value)
