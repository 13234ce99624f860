"""The dashboard's URL where a platform team looks: installed by the chart with dashboard.enabled, on a real control
plane, the operator (run with the flags the chart gave its Deployment, as the chart's ServiceAccount) puts each job's
page on that dashboard in the RolloutJob's status.dashboardUrl; a job writing outside the dashboard's folder gets
none (that dashboard does not show it). The chart's dashboard, run as its own ServiceAccount with its own arguments,
shows the cluster job's running count from that status before anything is in the bucket."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from kubernetes import client

from fixtures.servers import stop_process_group
from tracefleet.contract.dashboard import job_page_url
from tracefleet.contract.job import Counters, RolloutJobStatus
from tracefleet.contract.progress import JobProgress
from tracefleet.operator import names as n

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


def test_the_operator_names_the_charts_dashboard_in_status(kube: Any, s3: Any, tmp_path: Path) -> None:
    bucket = s3.create_bucket()
    r = kube.helm("install", RELEASE, str(CHART), "--namespace", NS, "--create-namespace", "--set", "image.tag=test",
                  "--set", "dashboard.enabled=true", "--set", f"dashboard.uri=s3://{bucket}/team")
    assert r.returncode == 0, r.stdout + r.stderr
    api = kube.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    op = dash = None
    try:
        deployment = client.AppsV1Api(api).read_namespaced_deployment(f"{RELEASE}-tracefleet", NS)
        (ctr,) = deployment.spec.template.spec.containers
        url = f"http://{RELEASE}-tracefleet-dashboard.{NS}.svc:8090"
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
        assert status("shown")["dashboardUrl"] == f"{url}/job?path={NS}%2Fshown"
        assert "dashboardUrl" not in status("elsewhere")
        # the chart's dashboard, as its own ServiceAccount with its own arguments: the cluster job's running count
        # and ETA come from its status (nothing of it is in the bucket yet)
        (dctr,) = client.AppsV1Api(api).read_namespaced_deployment(f"{RELEASE}-tracefleet-dashboard", NS).spec.template.spec.containers
        dash_kubeconfig = kube.service_account_kubeconfig(NS, f"{RELEASE}-tracefleet-dashboard", tmp_path / "dashboard.kubeconfig")
        dash = subprocess.Popen([sys.executable, "-m", "tracefleet.cli", "dashboard", *dctr.args, "--host=127.0.0.1", "--port=0"],
                                env={**os.environ, **s3.env(), "KUBECONFIG": str(dash_kubeconfig)}, stdout=subprocess.PIPE,
                                stderr=open(tmp_path / "dashboard.log", "w"), text=True, start_new_session=True)  # noqa: SIM115
        line = dash.stdout.readline() if dash.stdout else ""
        assert "http://" in line, (line, (tmp_path / "dashboard.log").read_text())
        base = line.rsplit(" ", 1)[-1].strip().rstrip("/")
        got = json.loads(urllib.request.urlopen(f"{base}/api/job?path={NS}/shown", timeout=30).read())
        progress = got["progress"]
        assert progress["driver"] == "kubernetes" and progress["finished"] is False
        counters = progress["counters"]  # status.counters (the job's one session: waiting for inference, or running)
        assert counters["total"] == 1 and counters["pending"] + counters["running"] == 1 and counters["succeeded"] == 0
        assert f"/job?path={NS}%2Felsewhere" not in urllib.request.urlopen(f"{base}/", timeout=30).read().decode()
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
