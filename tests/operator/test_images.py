"""The images, as a user gets them: `tracefleet images build` makes them with real podman; the tracefleet image a
job's pods run carries neither the operator's packages nor the trainer's; and the operator image,
run as a container (host network, the kubeconfig mounted) with exactly the arguments the chart gives its
Deployment, serves the chart's namespace with the chart's namespaced RBAC on the real API server: it reconciles
examples/k8s/first-job.yaml, writes its status and creates its harness pods with the images the chart names.

The build is cached by layer: cold (a fresh machine) about 3 minutes for the tracefleet image and a harness image,
warm seconds (the operator image: the tracefleet image's layers but the code's, then its packages and the code). A
harness image is built for the smallest CLI only; `make images` builds all six the same way."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from fixtures.controlplane import free_port
from tracefleet.contract import images
from tracefleet.operator import names as n
from tracefleet.runner.presets.base import harness_pins

REPO = Path(__file__).resolve().parents[2]
REGISTRY = "localhost/tracefleet-test"
TAG = images.release_tag()
HARNESS = "qwen-code"  # the smallest CLI (55 MB)
ONLY = (images.TRACEFLEET, images.OPERATOR, images.harness_image_name(HARNESS))
REFS = [f"{REGISTRY}/{name}:{TAG}" for name in ONLY]  # what the build tags
NAMESPACE = "tf-images"
RELEASE = "img"
CHART_MEMORY_REQUEST_MIB = 288  # charts/tracefleet/values.yaml resources.requests.memory


def tracefleet(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracefleet.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def built(container_runtime) -> list[str]:
    before = {ref: container_runtime.image_id(ref) for ref in REFS}  # a rebuild over an earlier run's images
    start = time.monotonic()
    r = tracefleet("images", "build", "--registry", REGISTRY, *(f"--only={name}" for name in ONLY), timeout=1200)
    assert r.returncode == 0, r.stdout + r.stderr
    print(f"images built in {time.monotonic() - start:.0f} s:\n{r.stdout}")
    # the images the rebuilt tags named before are gone, not left behind untagged (about 1 GB each)
    replaced = [old for ref, old in before.items() if old and container_runtime.image_id(ref) != old]
    assert [old for old in replaced if container_runtime.image_exists(old)] == [], replaced
    return [line.split(":", 2)[0] + ":" + line.split(":", 2)[1] for line in r.stdout.splitlines() if ": built in" in line]


def test_build_tags_what_list_names_and_the_images_run(built: list[str], container_runtime) -> None:
    listed = tracefleet("images", "list", "--registry", REGISTRY, *(f"--only={name}" for name in ONLY),
                        timeout=60).stdout.split()
    assert built == listed == REFS
    # non-root, git for the workspace, pytest for `tests` evaluators, every pod program's module, and neither the
    # operator's packages nor the trainer's (a module of a pod program importing them fails here)
    r = container_runtime.run("run", "--rm", built[0], "sh", "-c",
                              f"id -u && git --version && python -c '{POD_PROGRAMS_IMPORT}'", timeout=120)
    uid, git, imported = r.stdout.split("\n")[:3]
    assert uid == "65532" and git.startswith("git version") and imported == "[]", r.stdout + r.stderr
    # the operator image: the same user, the operator's packages over the tracefleet image's layers up to the code
    # (the wheel's two layers: a change to the code rebuilds only those in either image)
    r = container_runtime.run("run", "--rm", built[1], "sh", "-c",
                              "id -u && python -c 'import kopf, kubernetes, tracefleet.operator.cli; print(1)'",
                              timeout=120)
    assert r.stdout.split() == ["65532", "1"], r.stdout + r.stderr
    pods, operator = layers(container_runtime, built[0]), layers(container_runtime, built[1])
    assert pods[:-2] == operator[:len(pods) - 2] and len(operator) == len(pods) + 2
    # the harness image: the pinned CLI on PATH (the bundle's node), where `tracefleet run --in-pod` finds it
    pin = harness_pins()[HARNESS]
    r = container_runtime.run("run", "--rm", built[2], "sh", "-c", f"command -v {pin.bin} && {pin.bin} --version",
                              timeout=120)
    assert r.stdout.split() == ["/opt/tracefleet/bundle/bin/" + pin.bin, pin.version], r.stdout + r.stderr


# what a job's pods run (the proxy sidecar, the session program, evaluator and sealer Jobs, the engine gate); prints
# the operator's and trainer's packages found installed
POD_PROGRAMS_IMPORT = ("import importlib.util, pytest, tracefleet.proxy.cli, tracefleet.proxy.engine_gate, "
                       "tracefleet.runner.cli, tracefleet.runner.pod; "
                       "print([m for m in (\"kopf\", \"kubernetes\", \"torch\") if importlib.util.find_spec(m)])")


def layers(runtime, ref: str) -> list[str]:
    return json.loads(runtime.run("image", "inspect", "--format", "{{json .RootFS.Layers}}", ref, timeout=60).stdout)


class Models(http.server.BaseHTTPRequestHandler):
    """An engine's /v1/models: all the operator asks of an external engine before it starts sessions."""

    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps({"object": "list", "data": [{"id": "policy", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def chart_operator(kube, tmp: Path) -> tuple[dict[str, Any], Path]:
    """Install the chart with its defaults but the registry (so the CRD, the namespaced Roles and the Lease's
    are the chart's), and return its operator container and a kubeconfig of its ServiceAccount."""
    r = kube.helm("upgrade", "--install", RELEASE, str(REPO / "charts" / "tracefleet"), "--namespace", NAMESPACE,
                  "--create-namespace", "--set", f"image.registry={REGISTRY}", "--wait", "--timeout", "120s")
    assert r.returncode == 0, r.stdout + r.stderr
    dep = json.loads(kube.kubectl("-n", NAMESPACE, "get", "deploy", f"{RELEASE}-tracefleet", "-o", "json").stdout)
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    path = kube.service_account_kubeconfig(NAMESPACE, f"{RELEASE}-tracefleet", tmp / "operator.kubeconfig", duration="1h")
    path.chmod(0o644)  # read by the image's non-root user
    return container, path


def rss_mib(runtime, name: str) -> float:
    pid = runtime.run("inspect", "--format", "{{.State.Pid}}", name, timeout=60).stdout.strip()
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def test_operator_image_reconciles_the_example_with_the_charts_rbac(built, container_runtime, kube, engine_url,
                                                                    tmp_path: Path) -> None:
    t0 = time.monotonic()
    container, kubeconfig = chart_operator(kube, tmp_path)
    print(f"chart installed in {time.monotonic() - t0:.0f} s")
    assert container["image"] == built[1]  # the operator image; the children run the tracefleet image
    metrics_port, liveness_port = free_port(), free_port()
    # the chart's own arguments; only the listeners move to free ports (host network, shared with other tests)
    args = [a for a in container["args"] if not a.startswith(("--metrics-port=", "--liveness-port="))]
    args += [f"--metrics-port={metrics_port}", f"--liveness-port={liveness_port}", "--bind-address=127.0.0.1"]
    name = f"tf-operator-{uuid.uuid4().hex[:8]}"
    container_runtime.run("run", "-d", "--name", name, "--network", "host", "-v", f"{kubeconfig}:/kube/config:ro",
                          "-e", "KUBECONFIG=/kube/config", "-e", f"POD_NAMESPACE={NAMESPACE}", "-e", f"POD_NAME={name}",
                          container["image"], *container["command"], *args, timeout=120)
    api = kube.api_client()
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    try:
        core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "bucket-credentials"},
                                                  "stringData": {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}})
        job = yaml.safe_load((REPO / "examples" / "k8s" / "first-job.yaml").read_text())
        job["spec"]["inference"]["external"]["baseUrl"] = engine_url  # the one line a user edits
        custom.create_namespaced_custom_object(n.GROUP, n.VERSION, NAMESPACE, n.PLURAL, job)
        deadline = time.monotonic() + 120
        pods: list[Any] = []
        status: dict[str, Any] = {}
        while time.monotonic() < deadline and not (pods and status.get("phase") == "Running"):
            time.sleep(1)
            status = custom.get_namespaced_custom_object(n.GROUP, n.VERSION, NAMESPACE, n.PLURAL, "first-job").get("status") or {}
            pods = core.list_namespaced_pod(NAMESPACE, label_selector=n.LABEL_COMPONENT + "=" + n.COMPONENT_HARNESS).items
        print(f"job running in {time.monotonic() - t0:.0f} s")
        logs = container_runtime.run("logs", name, check=False, timeout=60)
        assert status.get("phase") == "Running" and len(pods) == 4, (status, logs.stdout[-3000:] + logs.stderr[-3000:])
        assert status["observedGeneration"] == 1 and status["counters"]["total"] == 4
        # the chart's namespaced RBAC is all it asked for: nothing forbidden on the way (no cluster-wide scan)
        assert "forbidden" not in (logs.stdout + logs.stderr).lower(), logs.stderr[-3000:]
        ready = next(c for c in status["conditions"] if c["type"] == "InferenceReady")
        assert ready["status"] == "True"
        # every child names an image the build made: the `command` harness runs in the tracefleet image
        spec = pods[0].spec
        assert {c.image for c in spec.containers + spec.init_containers} == {built[0]}
        rss = rss_mib(container_runtime, name)
        print(f"operator container RSS after reconciling the example: {rss:.0f} MiB")
        assert rss < CHART_MEMORY_REQUEST_MIB
    finally:
        # the job first, while its operator runs (it lets go of anything it holds), then the operator and the chart
        custom.delete_namespaced_custom_object(n.GROUP, n.VERSION, NAMESPACE, n.PLURAL, "first-job")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
                j["metadata"]["name"] == "first-job"
                for j in custom.list_namespaced_custom_object(n.GROUP, n.VERSION, NAMESPACE, n.PLURAL)["items"]):
            time.sleep(1)
        container_runtime.remove(name)
        kube.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
