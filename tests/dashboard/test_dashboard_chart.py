"""The chart's dashboard (charts/tracefleet/templates/dashboard.yaml): off by default; when enabled, a Deployment
running `tracefleet dashboard` on the values' URI with the bucket's credentials and a Service in front, on labels
of its own (the operator's Services never select it), a ServiceAccount that may read RolloutJobs (unless
dashboard.kubernetes is false: no token at all), and the operator told its URL; enabled without a URI, one line says what is missing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from fixtures.controlplane import controlplane_bin_dir

CHART = Path(__file__).resolve().parents[2] / "charts" / "tracefleet"


def helm_template(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(controlplane_bin_dir() / "helm"), "template", "rel", str(CHART), "--namespace", "tf-system",
                           "--kube-version", "v1.35.4", "--set", "image.registry=registry.example.com/team", *args],
                          capture_output=True, text=True, timeout=120)


def test_the_chart_runs_the_dashboard_when_enabled() -> None:
    off = helm_template()
    assert off.returncode == 0 and "dashboard" not in off.stdout
    on = helm_template("--set", "dashboard.enabled=true", "--set", "dashboard.uri=s3://rollouts/team",
                       "--set", "dashboard.credentialsSecret=bucket-readonly", "--set", "dashboard.endpointUrl=http://weed:8333")
    assert on.returncode == 0, on.stderr
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(on.stdout) if d}
    dep, svc = docs[("Deployment", "rel-tracefleet-dashboard")], docs[("Service", "rel-tracefleet-dashboard")]
    pod = dep["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    assert ctr["command"] == ["tracefleet", "dashboard"]
    assert ctr["args"] == ["s3://rollouts/team", "--host=0.0.0.0", "--port=8090", "--endpoint-url=http://weed:8333",
                           "--kubernetes", "--namespace=tf-system"]
    assert ctr["envFrom"] == [{"secretRef": {"name": "bucket-readonly"}}]
    # its own ServiceAccount, allowed to read RolloutJobs where the operator serves them, and nothing else
    assert pod["serviceAccountName"] == "rel-tracefleet-dashboard"
    assert docs[("Role", "rel-tracefleet-dashboard")]["rules"] == [
        {"apiGroups": ["tracefleet.io"], "resources": ["rolloutjobs"], "verbs": ["get", "list"]}]
    assert docs[("RoleBinding", "rel-tracefleet-dashboard")]["subjects"][0]["name"] == "rel-tracefleet-dashboard"
    bucket_only = helm_template("--set", "dashboard.enabled=true", "--set", "dashboard.uri=s3://rollouts/team",
                                "--set", "dashboard.kubernetes=false")
    dep = next(d for d in yaml.safe_load_all(bucket_only.stdout) if d and d["metadata"]["name"] == "rel-tracefleet-dashboard"
               and d["kind"] == "Deployment")
    assert dep["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert "--kubernetes" not in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items() and svc["spec"]["ports"][0]["port"] == 8090
    operator_selectors = [d["spec"]["selector"] for (kind, name), d in docs.items() if kind == "Service" and "dashboard" not in name]
    assert operator_selectors and not any(s.items() <= labels.items() for s in operator_selectors)
    # the operator names the dashboard's URL (its Service's, or dashboard.url) in each shown job's status
    (op,) = docs[("Deployment", "rel-tracefleet")]["spec"]["template"]["spec"]["containers"]
    assert {"--dashboard-url=http://rel-tracefleet-dashboard.tf-system.svc:8090", "--dashboard-uri=s3://rollouts/team"} <= set(op["args"])
    assert not any(a.startswith("--dashboard") for d in yaml.safe_load_all(off.stdout) if d and d["kind"] == "Deployment"
                   for c in d["spec"]["template"]["spec"]["containers"] for a in c.get("args", []))
    public = helm_template("--set", "dashboard.enabled=true", "--set", "dashboard.uri=s3://rollouts/team",
                           "--set", "dashboard.url=https://rollouts.example.com")
    assert "--dashboard-url=https://rollouts.example.com" in public.stdout


def test_enabled_without_a_uri_says_so() -> None:
    r = helm_template("--set", "dashboard.enabled=true")
    assert r.returncode != 0 and "dashboard.enabled needs dashboard.uri" in r.stderr
