"""The CRD: generated == checked in, structural, and what the real kube-apiserver does with it.

The cluster half uses the session-scoped `kube` fixture (tests/fixtures/controlplane.py): a real
etcd + kube-apiserver built from Go modules, so defaulting, pruning, CEL and printer columns are the
apiserver's own, not a re-implementation.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import pytest
import yaml

from tracefleet.api import RolloutJob, load_job
from tracefleet.api.crd import CRD_FILENAME, crd_manifest, crd_yaml, openapi_schema
from tracefleet.api.reference import END, REFERENCE_PAGE, START, manifest_reference, page_section

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / CRD_FILENAME
EXAMPLES = sorted((REPO / "examples").glob("*.yaml")) + sorted((REPO / "examples" / "k8s").glob("*.yaml"))
NAMESPACE = "foundation-crd"
# Free-form objects, where unknown fields are the point; everywhere else the apiserver prunes/refuses.
FREE_FORM = {"spec.tasks.inline[].metadata", "spec.diagnostics[].params"}


# ---------------------------------------------------------------- without a cluster


def test_checked_in_crd_matches_the_model() -> None:
    assert CRD_PATH.exists(), "run `tracefleet crd` to generate crds/"
    assert CRD_PATH.read_text() == crd_yaml(), "crds/ drifted from the model: run `tracefleet crd`"


def test_manifest_reference_page_matches_the_model() -> None:
    text = (REPO / REFERENCE_PAGE).read_text()
    assert START in text and END in text
    assert page_section(text) == manifest_reference(), "run `tracefleet crd` in the repository root"


def _walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}" if path else name)
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")


def test_schema_is_structural() -> None:
    schema = openapi_schema()
    forbidden = {"$ref", "$defs", "definitions", "title", "const", "allOf", "oneOf", "not", "nullable"}
    for path, node in _walk(schema, ""):
        assert not forbidden & node.keys(), (path, forbidden & node.keys())
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            continue
        assert "anyOf" not in node, path
        if node.get("x-kubernetes-preserve-unknown-fields"):
            assert path in FREE_FORM, f"{path}: preserve-unknown-fields outside the free-form allowlist"
            continue
        assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, path
        assert not ("properties" in node and "additionalProperties" in node), path
        if path.startswith("spec"):
            # CEL cost is estimated from these bounds; unbounded strings/lists make the apiserver refuse rules.
            if node["type"] == "string":
                assert "maxLength" in node or "enum" in node, f"{path}: string without maxLength"
            if node["type"] == "array":
                assert "maxItems" in node, f"{path}: array without maxItems"


def test_schema_carries_defaults_enums_and_rules() -> None:
    spec = openapi_schema()["properties"]["spec"]
    inference = spec["properties"]["inference"]
    assert inference["properties"]["capture"]["default"] == {}
    assert inference["properties"]["capture"]["properties"]["mode"] == {
        "type": "string", "description": inference["properties"]["capture"]["properties"]["mode"]["description"],
        "default": "auto", "enum": ["auto", "exact", "server"],
    }
    assert spec["properties"]["parallelism"]["minimum"] == 1
    assert [v["message"] for v in inference["x-kubernetes-validations"]] == ["exactly one of managed or external must be set"]
    rules = [v for _, n in _walk(spec, "spec") for v in n.get("x-kubernetes-validations", ())]
    assert len(rules) >= 10
    assert any("oldSelf" in v["rule"] for v in rules)
    inline = spec["properties"]["tasks"]["properties"]["inline"]
    assert inline["x-kubernetes-list-type"] == "map" and inline["x-kubernetes-list-map-keys"] == ["id"]
    version = crd_manifest()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Phase", "Done", "Total", "Batches", "Quarantined", "Age"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_satisfy_the_openapi_schema(path: Path) -> None:
    # jsonschema reads the OpenAPI v3 subset as draft 4; x-kubernetes-* keywords are ignored here and
    # exercised against the real apiserver below.
    jsonschema.Draft4Validator(openapi_schema()).validate(yaml.safe_load(path.read_text()))


# ---------------------------------------------------------------- against the real kube-apiserver


def kubectl(kube: Any, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return kube.kubectl(*args, input=input)


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"kubectl failed ({proc.returncode}): {proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def rj_cluster(kube: Any) -> Any:
    """The session cluster with the generated CRD installed and established, and a namespace for us."""
    _ok(kubectl(kube, "apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH)))
    _ok(kubectl(kube, "wait", "--for=condition=Established", f"crd/{CRD_PATH.name.removesuffix('.yaml')}", "--timeout=60s"))
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    _ok(kubectl(kube, "apply", "-f", "-", input=json.dumps(ns)))
    # Discovery of a fresh CRD can lag its Established condition by a moment.
    deadline = time.monotonic() + 30
    while kubectl(kube, "get", "rj", "-n", NAMESPACE).returncode != 0:
        assert time.monotonic() < deadline, "rolloutjobs never became discoverable"
        time.sleep(0.5)
    return kube


def test_apiserver_accepts_the_crd(rj_cluster: Any) -> None:
    got = json.loads(_ok(kubectl(rj_cluster, "get", "crd", "rolloutjobs.tracefleet.io", "-o", "json")))
    conditions = {c["type"]: c["status"] for c in got["status"]["conditions"]}
    assert conditions.get("Established") == "True" and conditions.get("NamesAccepted") == "True"
    # NonStructuralSchema would be set if the apiserver disagreed with our structural conversion.
    assert "NonStructuralSchema" not in conditions
    assert got["status"]["acceptedNames"]["shortNames"] == ["rj"]
    # `kubectl explain` reads the published OpenAPI, which the apiserver aggregates a little later.
    deadline = time.monotonic() + 60
    while (proc := kubectl(rj_cluster, "explain", "rolloutjob.spec.inference")).returncode != 0:
        assert time.monotonic() < deadline, proc.stderr
        time.sleep(1)
    explained = proc.stdout
    assert "managed" in explained and "external" in explained


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_apiserver_defaults_match_the_model(rj_cluster: Any, path: Path) -> None:
    """Server-side dry-run returns the object after pruning and defaulting: it must equal the model's view."""
    out = _ok(kubectl(rj_cluster, "create", "--dry-run=server", "-n", NAMESPACE, "-o", "json", "-f", str(path)))
    stored = json.loads(out)
    assert stored["spec"] == load_job(path).to_manifest()["spec"]


def test_kubectl_get_rj_shows_printer_columns(rj_cluster: Any) -> None:
    name = "printer-columns"
    job = yaml.safe_load((REPO / "examples" / "local-command.yaml").read_text())
    job["metadata"] = {"name": name, "namespace": NAMESPACE}
    _ok(kubectl(rj_cluster, "apply", "-f", "-", input=json.dumps(job)))
    status = {"status": {"phase": "Running", "counters": {"total": 10, "succeeded": 3, "running": 2, "judged": 3, "quarantined": 1},
                         "batchesCompleted": 1}}
    _ok(kubectl(rj_cluster, "patch", "rolloutjob", name, "-n", NAMESPACE, "--subresource=status",
                "--type=merge", "-p", json.dumps(status)))
    table = _ok(kubectl(rj_cluster, "get", "rj", name, "-n", NAMESPACE)).splitlines()
    assert table[0].split() == ["NAME", "PHASE", "DONE", "TOTAL", "BATCHES", "QUARANTINED", "AGE"], table
    row = table[1].split()
    assert row[:6] == [name, "Running", "3", "10", "1", "1"], table
    # The category lets `kubectl get tracefleet` list every tracefleet resource.
    assert name in _ok(kubectl(rj_cluster, "get", "tracefleet", "-n", NAMESPACE))
    # The status subresource: a status write through the main resource is ignored.
    _ok(kubectl(rj_cluster, "patch", "rj", name, "-n", NAMESPACE, "--type=merge", "-p",
                json.dumps({"status": {"phase": "Failed"}})))
    assert _ok(kubectl(rj_cluster, "get", "rj", name, "-n", NAMESPACE, "-o", "jsonpath={.status.phase}")) == "Running"


def test_apiserver_keeps_managed_by_immutable(rj_cluster: Any) -> None:
    name = "immutable-managed-by"
    job = yaml.safe_load((REPO / "examples" / "k8s" / "bucket-tasks-kueue.yaml").read_text())
    job["metadata"] = {"name": name, "namespace": NAMESPACE}
    _ok(kubectl(rj_cluster, "apply", "-f", "-", input=json.dumps(job)))
    # Other fields stay editable.
    _ok(kubectl(rj_cluster, "patch", "rj", name, "-n", NAMESPACE, "--type=merge", "-p", '{"spec":{"parallelism":2}}'))
    for patch in ('{"spec":{"managedBy":"tracefleet.io/operator"}}', '{"spec":{"managedBy":null}}'):
        proc = kubectl(rj_cluster, "patch", "rj", name, "-n", NAMESPACE, "--type=merge", "-p", patch)
        assert proc.returncode != 0, patch
        assert re.search(r"spec\.managedBy: Invalid value: .*managedBy is immutable", proc.stderr), proc.stderr
