"""The Helm chart: CRDs identical to crds/, `helm lint` and `helm template` clean, least-privilege RBAC scoped to the
namespaces it serves, the images it names are the ones `tracefleet images build` makes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fixtures.controlplane import controlplane_bin_dir
from tracefleet.contract import images

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tracefleet"
REGISTRY = images.DEFAULT_REGISTRY  # what every render here names: the chart itself names no registry


def helm() -> str:
    path = controlplane_bin_dir() / "helm"
    if not path.exists():
        pytest.fail(f"helm missing at {path}: run `bash hack/setup.sh` (builds the control-plane binaries)", pytrace=False)
    return str(path)


def render(*args: str) -> list[dict]:
    r = subprocess.run([helm(), "template", "rel", str(CHART), "--namespace", "tf-system", "--kube-version", "v1.35.4",
                        "--set", f"image.registry={REGISTRY}", *args],
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
    r = subprocess.run([helm(), "lint", "--strict", str(CHART), "--set", f"image.registry={REGISTRY}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 chart(s) failed" in r.stdout


def test_install_without_a_registry_says_to_name_one() -> None:
    """No registry publishes the images: a chart that named one by default would install pods that never pull."""
    r = subprocess.run([helm(), "template", "rel", str(CHART), "--kube-version", "v1.35.4"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "image.registry: name the registry you pushed the images to" in r.stderr and "make images" in r.stderr


def test_jobs_pull_secrets_and_bucket_endpoint_reach_the_operator() -> None:
    def operator_args(*flags: str) -> list[str]:
        dep = next(d for d in render(*flags) if d["kind"] == "Deployment")
        return dep["spec"]["template"]["spec"]["containers"][0]["args"]

    # by default the jobs pull with the operator's own secrets: the images come from one registry
    args = operator_args("--set", "imagePullSecrets[0].name=regcred")
    assert "--image-pull-secret=regcred" in args and not any(a.startswith("--bucket-endpoint") for a in args)
    args = operator_args("--set", "imagePullSecrets[0].name=regcred", "--set", "operator.jobImagePullSecrets={team-a,team-b}",
                         "--set", "operator.bucketEndpoint=http://seaweedfs.storage.svc:8333")
    assert [a for a in args if a.startswith("--image-pull-secret")] == ["--image-pull-secret=team-a", "--image-pull-secret=team-b"]
    assert "--bucket-endpoint=http://seaweedfs.storage.svc:8333" in args
    assert not any(a.startswith("--image-pull-secret") for a in operator_args("--set", "operator.jobImagePullSecrets=null"))


def test_template_defaults_two_operators_on_a_lease_with_probes() -> None:
    docs = render()
    kinds = sorted(d["kind"] for d in docs)
    # namespaced by default: a Role for the release namespace it serves and one for the Lease, nothing cluster-wide
    assert kinds == sorted(["ServiceAccount", "Deployment", "Service", "Role", "RoleBinding", "Role", "RoleBinding",
                            "PodDisruptionBudget"])
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    pod = dep["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    assert ctr["command"] == ["tracefleet", "operator"]
    assert "--namespace=tf-system" in ctr["args"] and "--all-namespaces" not in ctr["args"]
    assert "--leader-elect" in ctr["args"] and "--lease-namespace=tf-system" in ctr["args"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in ctr["env"]
    # the Lease: in the release namespace, only the verbs the election uses
    lease_role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-leader-election"))
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
    role = next(d for d in render("--set", "operator.allNamespaces=true") if d["kind"] == "ClusterRole")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
    grants: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                grants.setdefault((g, r), set()).update(rule["verbs"])
    # read named Secrets, create the jobs' engine keys: never list/watch every secret, never change one
    assert grants[("", "secrets")] == {"get", "create"}
    assert grants[("tracefleet.io", "rolloutjobs/status")] == {"get", "patch"}
    assert "create" not in grants[("tracefleet.io", "rolloutjobs")]
    assert not any(r in ("roles", "rolebindings", "clusterroles") for _, r in grants)


def test_namespaced_rbac_servicemonitor_and_schema() -> None:
    docs = render("--set", "operator.watchNamespaces={team-a,team-b}", "--set", "metrics.serviceMonitor.enabled=true")
    roles = [d for d in docs if d["kind"] == "Role" and not d["metadata"]["name"].endswith("-leader-election")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--all-namespaces" not in args
    assert any(d["kind"] == "ServiceMonitor" for d in docs)
    # values.schema.json: a negative replica count is refused
    r = subprocess.run([helm(), "template", "rel", str(CHART), "--kube-version", "v1.35.4", "--set", "operator.replicas=-1",
                        "--set", f"image.registry={REGISTRY}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "replicas" in r.stderr
    json.loads((CHART / "values.schema.json").read_text())


def test_default_rbac_is_namespaced_and_secrets_are_read_by_name() -> None:
    """Least privilege by default: every grant is a Role in a namespace the operator serves (nothing cluster-wide);
    Secrets are `get` only (never listed or watched), narrowed to rbac.secretNames when given, and `create` for the
    jobs' engine keys; all namespaces only when asked, as a ClusterRole."""
    docs = render()
    assert not [d for d in docs if d["kind"].startswith("Cluster")]
    (served,) = [d for d in docs if d["kind"] == "Role" and not d["metadata"]["name"].endswith("-leader-election")]
    assert served["metadata"]["namespace"] == "tf-system"
    secrets, made = [r for r in served["rules"] if "secrets" in r["resources"]]
    assert secrets == {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
    assert made == {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}  # the jobs' engine keys
    named = render("--set", "rbac.secretNames={bucket-credentials,trainer-webhook}")
    secrets, _ = [r for d in named if d["kind"] == "Role" for r in d["rules"] if "secrets" in r["resources"]]
    assert secrets["resourceNames"] == ["bucket-credentials", "trainer-webhook"] and secrets["verbs"] == ["get"]
    everywhere = render("--set", "operator.allNamespaces=true")
    assert {d["kind"] for d in everywhere} >= {"ClusterRole", "ClusterRoleBinding"}
    args = next(d for d in everywhere if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args and not any(a.startswith("--namespace=") for a in args)


def test_requests_cover_the_measured_rss_and_a_pdb_keeps_one_replica() -> None:
    docs = render()
    ctr = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    # ~160 MiB idle, ~230 MiB watching 10,000 live pods (docs/kubernetes/index.md): request = peak x 1.25
    assert ctr["resources"]["requests"]["memory"] == "288Mi" and ctr["resources"]["limits"]["memory"] == "576Mi"
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == next(d for d in docs if d["kind"] == "Deployment")["spec"]["selector"]["matchLabels"]
    # one replica: no budget (it would block every drain)
    assert not any(d["kind"] == "PodDisruptionBudget" for d in render("--set", "operator.replicas=1"))


def test_default_images_are_the_ones_images_build_makes() -> None:
    """Every image the chart names, and the operator's harness image of every preset, is one `tracefleet images
    list` prints for the same registry and tag; the chart's appVersion is the package's version."""
    from tracefleet.operator.config import DEFAULT_HARNESS_IMAGE, DEFAULT_IMAGE
    from tracefleet.runner.presets.base import harness_pins

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == images.release_tag()
    for registry, tag, flags in ((images.DEFAULT_REGISTRY, images.release_tag(), ()),
                                 ("registry.example.com/team", "dev", ("--set", "image.registry=registry.example.com/team",
                                                                      "--set", "image.tag=dev"))):
        built = set(subprocess.run([sys.executable, "-m", "tracefleet.cli", "images", "list", "--registry", registry,
                                    "--tag", tag], capture_output=True, text=True, check=True).stdout.split())
        docs = render(*flags)
        named = {c["image"] for d in docs if d["kind"] == "Deployment"
                 for c in d["spec"]["template"]["spec"]["containers"]}
        args = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        flag = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args if "=" in a}
        named |= {flag["--proxy-image"], flag["--evaluator-image"]}
        named |= {flag["--harness-image"].replace("{preset}", p) for p in harness_pins()}
        assert named <= built, named - built
        assert len(named) == len(built)  # and the chart can name each one the command builds
        if registry == images.DEFAULT_REGISTRY:  # the operator's own defaults, without the chart
            assert DEFAULT_IMAGE in built and DEFAULT_HARNESS_IMAGE.replace("{preset}", "codex") in built
