"""The dashboard's URL where a platform team looks: installed by the chart with dashboard.enabled, on a real control
plane, the operator (run with the flags the chart gave its Deployment, as the chart's ServiceAccount) puts each job's
page on that dashboard in the RolloutJob's status.dashboardUrl; a job writing outside the dashboard's folder gets
none (that dashboard does not show it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from fixtures.servers import stop_process_group
from tracefleet.contract.dashboard import job_page_url
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
    op = None
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
    finally:
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
