"""The dashboard's URL where a platform team looks: installed by the chart with dashboard.enabled, on a real control
plane, the operator (run with the flags the chart gave its Deployment, as the chart's ServiceAccount) puts each job's
page on that dashboard in the RolloutJob's status.dashboardUrl; a job writing outside the dashboard's folder gets
none (that dashboard does not show it). The chart's dashboard, run as its own ServiceAccount with its own arguments,
shows the cluster job's running count from that status before anything is in the bucket."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from kubernetes import client

from fixtures.controlplane import host_address
from fixtures.servers import stop_process_group
from tracefleet.contract.dashboard import job_page_url
from tracefleet.contract.job import Counters, RolloutJobStatus
from tracefleet.contract.progress import JobProgress
from tracefleet.operator import names as n
from tracefleet.operator.status import EVENT_DASHBOARD_URL

CHART = Path(__file__).resolve().parents[2] / "charts" / "tracefleet"
NS = "dash-team"
RELEASE = "dash"


def rolloutjob(ns: str, name: str, output: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{n.GROUP}/{n.VERSION}", "kind": "RolloutJob", "metadata": {"name": name, "namespace": ns},
        "spec": {
            "inference": {"managed": {"model": "Qwen/Qwen3-4B", "servedModelName": "qwen", "gpusPerReplica": 1}},
            "harness": {"preset": "codex", "image": "reg.local/codex:1", "sessionTimeoutSeconds": 600},
            "tasks": {"inline": [{"id": "t0", "prompt": "task 0"}], "samplesPerTask": 1},
            "evaluator": {"preset": "tests", "image": "reg.local/eval:1", "timeoutSeconds": 120},
            "output": {"uri": output, "credentialsSecretRef": {"name": "bucket-creds"}, "tracesPerBatch": 1},
        },
    }


def proxied(core: client.CoreV1Api, service: str, path: str, query_path: str | None = None) -> str:
    """GET `path` of the Service through the API server's service proxy (to the Service's endpoints)."""
    kw = {"path2": query_path} if query_path is not None else {}  # path2: the proxied request's `?path=`
    r = core.connect_get_namespaced_service_proxy_with_path(f"{service}:http", NS, path, _preload_content=False,
                                                            _request_timeout=30, **kw)
    return r.data.decode()


def test_the_operator_names_the_charts_dashboard_in_status(kube: Any, s3: Any, tmp_path: Path) -> None:
    bucket = s3.create_bucket()
    # the pod's process runs here, on this machine's address (the pod's IP below) and a port free on it
    address = host_address()
    with socket.socket() as sock:
        sock.bind((address, 0))
        port = sock.getsockname()[1]
    r = kube.helm("install", RELEASE, str(CHART), "--namespace", NS, "--create-namespace", "--set", "image.tag=test",
                  "--set", "image.registry=registry.example.com/team", "--set", "dashboard.enabled=true", "--set", f"dashboard.uri=s3://{bucket}/team", "--set", f"dashboard.port={port}")
    assert r.returncode == 0, r.stdout + r.stderr
    api = kube.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    service = f"{RELEASE}-tracefleet-dashboard"
    op = dash = None
    try:
        deployment = client.AppsV1Api(api).read_namespaced_deployment(f"{RELEASE}-tracefleet", NS)
        (ctr,) = deployment.spec.template.spec.containers
        url = f"http://{service}.{NS}.svc:{port}"
        assert f"--dashboard-url={url}" in ctr.args and f"--dashboard-uri=s3://{bucket}/team" in ctr.args
        kubeconfig = kube.service_account_kubeconfig(NS, f"{RELEASE}-tracefleet", tmp_path / "operator.kubeconfig")
        core.create_namespaced_secret(NS, {"metadata": {"name": "bucket-creds"}, "stringData": {
            "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key, "AWS_ENDPOINT_URL": s3.endpoint}})
        log = tmp_path / "operator.log"
        # the chart's own arguments, its listeners moved off the ports a test machine may have taken
        op = subprocess.Popen([sys.executable, "-m", "tracefleet.operator", *ctr.args, "--metrics-port=0", "--liveness-port=0",
                               "--interval=1"], env={**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": NS},
                              stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)  # noqa: SIM115
        for name, output in (("shown", f"s3://{bucket}/team/{NS}"), ("elsewhere", f"s3://{bucket}/other")):
            custom.create_namespaced_custom_object(n.GROUP, n.VERSION, NS, n.PLURAL, rolloutjob(NS, name, output))

        def status(name: str) -> dict[str, Any]:
            return custom.get_namespaced_custom_object(n.GROUP, n.VERSION, NS, n.PLURAL, name).get("status") or {}

        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (status("shown").get("phase") and status("elsewhere").get("phase")):
            time.sleep(0.5)
        assert status("shown").get("phase") and status("elsewhere").get("phase"), log.read_text()[-4000:]
        page = f"{url}/job?path={NS}%2Fshown"
        assert status("shown")["dashboardUrl"] == page
        assert "dashboardUrl" not in status("elsewhere")

        # the chart's dashboard: its pod (KWOK's) given this machine's address, its process run here as the chart's
        # ServiceAccount with the chart's arguments, listening on that address (the pod's 0.0.0.0)
        def started() -> list[Any]:  # KWOK's part done (Running, its own IP): nothing of its overwrites the IP after
            return [p for p in core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/component=dashboard").items
                    if p.status.phase == "Running" and p.status.pod_ip]

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not started():
            time.sleep(0.2)
        (pod,) = started()
        kube.run_pod_here(NS, pod.metadata.name, address)
        (dctr,) = client.AppsV1Api(api).read_namespaced_deployment(service, NS).spec.template.spec.containers
        assert "--host=0.0.0.0" in dctr.args and f"--port={port}" in dctr.args
        dash_kubeconfig = kube.service_account_kubeconfig(NS, service, tmp_path / "dashboard.kubeconfig")
        dash = subprocess.Popen([sys.executable, "-m", "tracefleet.cli", *dctr.command[1:],
                                 *[f"--host={address}" if a == "--host=0.0.0.0" else a for a in dctr.args]],
                                env={**os.environ, **s3.env(), "KUBECONFIG": str(dash_kubeconfig)}, stdout=subprocess.PIPE,
                                stderr=open(tmp_path / "dashboard.log", "w"), text=True, start_new_session=True)  # noqa: SIM115
        line = dash.stdout.readline() if dash.stdout else ""
        assert f"http://{address}:{port}/" in line, (line, (tmp_path / "dashboard.log").read_text())

        def endpoints() -> list[str]:
            subsets = core.read_namespaced_endpoints(service, NS).subsets or []
            return [f"{a.ip}:{p.port}" for s in subsets for a in s.addresses or [] for p in s.ports or []]

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and endpoints() != [f"{address}:{port}"]:
            time.sleep(0.2)
        assert endpoints() == [f"{address}:{port}"]  # the endpoint controller's, from the pod the chart's Service selects

        # through the Service: the cluster job's running count and ETA come from its status (nothing of it is in
        # the bucket yet)
        progress = json.loads(proxied(core, service, "api/job", f"{NS}/shown"))["progress"]
        assert progress["driver"] == "kubernetes" and progress["finished"] is False
        counters = progress["counters"]  # status.counters (the job's one session: waiting for inference, or running)
        assert counters["total"] == 1 and counters["pending"] + counters["running"] == 1 and counters["succeeded"] == 0
        html = proxied(core, service, "job", f"{NS}/shown")  # the page status.dashboardUrl names
        shown = dict(re.findall(r"data-count=.(\w+).>([^<]*)<", html))
        assert (shown["total"], shown["finished"], int(shown["pending"]) + int(shown["running"])) == ("1", "0", 1), html[-2000:]
        assert f"{NS}%2Fshown" in proxied(core, service, "") and f"{NS}%2Felsewhere" not in proxied(core, service, "")

        # the URL is named once in an Event on the job too, though the operator has made many passes since
        def events(job: str) -> list[Any]:
            return [e for e in core.list_namespaced_event(NS, field_selector=f"involvedObject.name={job}").items
                    if e.reason == EVENT_DASHBOARD_URL]

        (event,) = events("shown")
        assert event.type == "Normal" and page in event.message and event.involved_object.kind == n.KIND
        assert events("elsewhere") == []
    finally:
        if dash is not None:
            stop_process_group(dash)
        if op is not None:
            stop_process_group(op)
        kube.helm("uninstall", RELEASE, "--namespace", NS)
        kube.kubectl("delete", "namespace", NS, "--wait=false")


def test_a_jobs_page_under_the_dashboards_folder() -> None:
    base, root = "http://dash:8090/", "s3://b/team"
    assert job_page_url(base, root, "s3://b/team", "j") == "http://dash:8090/job?path=j"
    assert job_page_url(base, root, "s3://b/team/ns/", "j") == "http://dash:8090/job?path=ns%2Fj"
    assert job_page_url(base, root, "s3://b/teamwork", "j") is None  # a sibling folder, not under it
    assert job_page_url("", root, "s3://b/team", "j") is None  # no dashboard


def test_a_cluster_jobs_progress_is_its_status() -> None:
    now = datetime(2026, 11, 27, 12, 0, 0, tzinfo=timezone.utc)
    status = RolloutJobStatus(phase="Running", counters=Counters(total=10, running=2, succeeded=3, failed=1, pending=4),
                              start_time=now - timedelta(seconds=60), batches_completed=2)
    p = JobProgress.of_status("j", status, now)
    assert (p.driver, p.counters.finished, p.batches, p.finished, p.eta_s) == ("kubernetes", 4, 2, False, 90.0)  # 60 s / 4 * 6
    done = JobProgress.of_status("j", status.model_copy(update={"phase": "Succeeded"}), now)
    assert done.finished and done.eta_s is None
