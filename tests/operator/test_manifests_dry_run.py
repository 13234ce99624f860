"""What a user applies, checked as the cluster checks it: the chart rendered with its defaults (and the CRD it
carries) and every cluster example in examples/k8s/, each `kubectl apply --dry-run=server` against the real API
server (schema, CEL rules, RBAC objects, the PodDisruptionBudget)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples" / "k8s").glob("*.yaml"))
NAMESPACE = "tf-dry-run"


@pytest.fixture(scope="module")
def cluster(kube):
    kube.kubectl("create", "namespace", NAMESPACE)
    r = kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))  # the examples' kind
    assert r.returncode == 0, r.stderr
    r = kube.kubectl("wait", "--for=condition=Established", "crd/rolloutjobs.tracefleet.io", "--timeout=60s")
    assert r.returncode == 0, r.stderr
    return kube


@pytest.mark.parametrize("values", [(), ("--set", "operator.allNamespaces=true"),
                                    ("--set", f"operator.watchNamespaces={{{NAMESPACE},default}}")],
                         ids=["defaults", "all-namespaces", "watch-namespaces"])
def test_rendered_chart_is_accepted_by_the_api_server(cluster, values: tuple[str, ...]) -> None:
    r = cluster.helm("template", "dry", str(REPO / "charts" / "tracefleet"), "--namespace", NAMESPACE, "--include-crds",
                     "--kube-version", cluster.version, "--set", "image.registry=registry.example.com/team", *values)
    assert r.returncode == 0, r.stderr
    applied = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=r.stdout)
    assert applied.returncode == 0, applied.stderr
    kinds = {line.split("/", 1)[0] for line in applied.stdout.splitlines()}
    assert {"deployment.apps", "poddisruptionbudget.policy", "serviceaccount"} <= kinds, applied.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_cluster_example_is_accepted_by_the_api_server(cluster, example: Path) -> None:
    r = cluster.kubectl("apply", "--dry-run=server", "-n", NAMESPACE, "-f", str(example))
    assert r.returncode == 0, r.stderr
    assert "rolloutjob.tracefleet.io/" in r.stdout and "(server dry run)" in r.stdout, r.stdout


def test_install_notes_point_at_an_example_that_exists(cluster) -> None:
    r = cluster.helm("install", "notes", str(REPO / "charts" / "tracefleet"), "--namespace", NAMESPACE, "--dry-run=server",
                     "--set", "image.registry=registry.example.com/team")
    assert r.returncode == 0, r.stderr
    notes = r.stdout.split("NOTES:", 1)[1]
    named = {word for word in notes.split() if word.startswith("examples/")}
    assert named == {"examples/k8s/first-job.yaml"} and all((REPO / path).is_file() for path in named), notes
    assert f"kubectl -n {NAMESPACE} apply -f examples/k8s/first-job.yaml" in notes, notes
