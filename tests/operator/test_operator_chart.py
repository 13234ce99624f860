"""The Helm chart: CRDs identical to crds/, `helm lint` and `helm template` clean, least-privilege RBAC."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from fixtures.controlplane import controlplane_bin_dir

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tracefleet"


def helm() -> str:
    path = controlplane_bin_dir() / "helm"
    if not path.exists():
        pytest.fail(f"helm missing at {path}: run `bash hack/setup.sh` (builds the control-plane binaries)", pytrace=False)
    return str(path)


def render(*args: str) -> list[dict]:
    r = subprocess.run([helm(), "template", "rel", str(CHART), "--namespace", "tf-system", "--kube-version", "v1.35.4", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def test_chart_crds_identical_to_top_level_crds() -> None:
    top = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    chart = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert top and top == chart, "copy crds/*.yaml into charts/tracefleet/crds/"
    for name in top:
        assert (CHART / "crds" / name).read_bytes() == (REPO / "crds" / name).read_bytes(), (
            f"charts/tracefleet/crds/{name} differs from crds/{name}: cp crds/{name} charts/tracefleet/crds/"
        )


def test_helm_lint_is_clean() -> None:
    r = subprocess.run([helm(), "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 chart(s) failed" in r.stdout


def test_template_defaults_two_operators_on_a_lease_with_probes() -> None:
    docs = render()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service", "Role", "RoleBinding"])
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    pod = dep["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    assert ctr["command"] == ["tracefleet", "operator"]
    assert "--all-namespaces" in ctr["args"]
    assert "--leader-elect" in ctr["args"] and "--lease-namespace=tf-system" in ctr["args"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in ctr["env"]
    # the Lease: in the release namespace, only the verbs the election uses
    lease_role = next(d for d in docs if d["kind"] == "Role")
    assert lease_role["metadata"]["namespace"] == "tf-system"
    assert lease_role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}]
    # one replica without the Lease: Recreate, never two at once
    single = next(d for d in render("--set", "operator.replicas=1", "--set", "operator.leaderElection.enabled=false")
                  if d["kind"] == "Deployment")
    assert single["spec"]["strategy"] == {"type": "Recreate"}
    assert "--leader-elect" not in single["spec"]["template"]["spec"]["containers"][0]["args"]
    assert ctr["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert ctr["securityContext"]["readOnlyRootFilesystem"] is True
    svc = next(d for d in docs if d["kind"] == "Service")
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    assert pod["serviceAccountName"] == next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]


def test_rbac_is_least_privilege() -> None:
    role = next(d for d in render() if d["kind"] == "ClusterRole")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
    grants = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert grants[("", "secrets")] == {"get"}  # read named Secrets only: never list/watch every secret
    assert grants[("tracefleet.io", "rolloutjobs/status")] == {"get", "patch"}
    assert "create" not in grants[("tracefleet.io", "rolloutjobs")]
    assert not any(r in ("roles", "rolebindings", "clusterroles") for _, r in grants)


def test_namespaced_rbac_servicemonitor_and_schema() -> None:
    docs = render("--set", "rbac.clusterWide=false", "--set", "operator.watchNamespaces={team-a,team-b}",
                  "--set", "metrics.serviceMonitor.enabled=true")
    roles = [d for d in docs if d["kind"] == "Role" and not d["metadata"]["name"].endswith("-leader-election")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--all-namespaces" not in args
    assert any(d["kind"] == "ServiceMonitor" for d in docs)
    # values.schema.json: a negative replica count is refused
    r = subprocess.run([helm(), "template", "rel", str(CHART), "--kube-version", "v1.35.4", "--set", "operator.replicas=-1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "replicas" in r.stderr
    json.loads((CHART / "values.schema.json").read_text())
