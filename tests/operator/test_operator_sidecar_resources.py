"""The proxy sidecar reserves what its capture mode measured (bench/sidecar.py), and a RolloutJob's
spec.inference.capture.proxyResources reaches the pod, key by key over those defaults."""

from __future__ import annotations


import yaml

from fixtures.plans import plan_of
from tracefleet.contract.job import RolloutJob
from tracefleet.contract.sidecar_resources import PROXY_RESOURCES
from tracefleet.operator.children.harness import harness_pod

from fixtures.rolloutjobs import POD_CONFIG, managed_codex_body


def sidecar_resources(capture: str) -> dict:
    body = managed_codex_body()
    body["spec"]["inference"]["capture"] = yaml.safe_load(capture)
    pod = harness_pod(RolloutJob.model_validate(body), POD_CONFIG, plan_of(RolloutJob.model_validate(body), 0), attempt=0).manifest
    (proxy,) = pod["spec"]["initContainers"]
    return proxy["resources"]


def test_defaults_are_per_capture_mode() -> None:
    server, exact = PROXY_RESOURCES["server"], PROXY_RESOURCES["exact"]
    assert sidecar_resources("{mode: server}") == server
    assert sidecar_resources("{mode: exact}") == exact
    assert sidecar_resources("{}") == exact  # auto becomes exact wherever it can: reserved for it
    assert "cpu" not in server["limits"] and "cpu" not in exact["limits"]  # a throttled sidecar slows every call
    assert server["requests"]["memory"] != exact["requests"]["memory"]


def test_the_jobs_override_reaches_the_pod_over_the_defaults() -> None:
    got = sidecar_resources("{mode: exact, proxyResources: {requests: {memory: 160Mi}, limits: {memory: 320Mi, cpu: 1}}}")
    assert got == {"requests": {"cpu": PROXY_RESOURCES["exact"]["requests"]["cpu"], "memory": "160Mi"},
                   "limits": {"memory": "320Mi", "cpu": "1"}}  # a quantity as the API types it (and returns it)
    assert sidecar_resources("{mode: server, proxyResources: {requests: {cpu: 200m}}}") == {
        "requests": {**PROXY_RESOURCES["server"]["requests"], "cpu": "200m"}, "limits": PROXY_RESOURCES["server"]["limits"]}
