"""RolloutJobs on a real node (tests/fixtures/node.py): a kubelet, containerd and runc run every pod, the operator's
and the bucket's included, from the images `tracefleet images build` makes, named as the chart names them for users.

`helm install` of the chart from the repository, its defaults but one replica: the operator runs as the chart's
Deployment, in a pod on the node, with the chart's ServiceAccount and RBAC, and reaches the API server through the
`kubernetes` Service (kube-proxy). The bucket is in the cluster: SeaweedFS as a pod and a Service on its usual S3 port
(8333, plain HTTP); the sidecars and sealers write it by the Service's name (cluster DNS), and the test reads the
batches through BatchReader from outside the cluster (the Service's address), as a trainer does. The engine (the scripted `tracefleet engine`) runs
on this machine's address, as an external engine does.

Two jobs, applied with kubectl: examples/k8s/first-job.yaml with the one line a user edits (the engine's URL), a
`command` harness in the tracefleet image; and Qwen Code from its harness image, whose own shell tool writes the file
a command evaluator judges. For each, the test watches every child pod (harness pods with the proxy as a native
sidecar, evaluator and sealer Jobs) and asks the kubelet's own reports: Succeeded (the harness pods Running first),
every container started and terminated with exit code 0, each pod with its own address; then reads the sealed batches through BatchReader.

Measured (2 cores): on a quiet machine the node Ready in 5.7 s, the chart's operator pod available 4.4 s after
`helm install`, `kubectl apply` to the first sealed batch 18 s and to Succeeded 21-25 s; shared with other sessions'
suites, the node in up to 19 s and the first sealed batch in 24-46 s (97 s once); the two images
rebuilt from the layer cache in 5-12 s, loaded into containerd in 19-25 s each when they changed (never when the
image id is the same).

Not yet on the node: the NetworkPolicy enforcer.
"""

from __future__ import annotations

import yaml

from fixtures.harness_runs import EXPECTED_NOTE, PROMPT, harness_script
from fixtures.node_jobs import CLI, REPO, Installed, run_job


def test_first_job_runs_on_the_real_node(node, installed: Installed, host_engine, cluster_s3) -> None:
    manifest = yaml.safe_load((REPO / "examples" / "k8s" / "first-job.yaml").read_text())
    manifest["spec"]["inference"]["external"]["baseUrl"] = host_engine.url  # the one line a user edits
    manifest["spec"]["output"]["uri"] = f"s3://{installed.bucket}/rollouts"
    status, reader = run_job(node, installed, cluster_s3, manifest)
    # the batches a trainer reads
    seqs = reader.seqs()
    assert len(seqs) == 2 and status["batchesCompleted"] == 2
    traces = [t for seq in seqs for t in reader.read(seq).traces()]
    assert len(traces) == 4 and all(int(t.loss_mask.sum()) > 0 for t in traces)


def test_a_real_cli_preset_runs_on_the_real_node(node, installed: Installed, host_engine, cluster_s3) -> None:
    """Qwen Code from its harness image (the chart's default for the preset): two shell rounds through its own
    tool, judged by a command evaluator on the file they wrote."""
    host_engine.configure(**harness_script(CLI))
    try:
        manifest = {
            "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "cli-job"},
            "spec": {
                "inference": {"external": {"baseUrl": host_engine.url}, "capture": {"mode": "server"}},
                "harness": {"preset": CLI, "sessionTimeoutSeconds": 240},
                "tasks": {"inline": [{"id": "note", "prompt": PROMPT}], "samplesPerTask": 2},
                "evaluator": {"preset": "command", "timeoutSeconds": 60,
                              "command": ["sh", "-c", f"printf '{EXPECTED_NOTE}' | cmp -s - note.txt"]},
                "output": {"uri": f"s3://{installed.bucket}/cli", "tracesPerBatch": 2,
                           "credentialsSecretRef": {"name": "bucket-credentials"}},
                "parallelism": 2,
            },
        }
        status, reader = run_job(node, installed, cluster_s3, manifest)
    finally:
        host_engine.reset()
    (seq,) = reader.seqs()
    traces = reader.read(seq).traces()
    assert len(traces) >= 2 and all(t.meta.harness == CLI for t in traces)
    assert {t.meta.reward for t in traces} == {1.0}  # the CLI's shell tool wrote note.txt in the harness container
    assert sum(int(t.loss_mask.sum()) for t in traces) > 0
    assert status["counters"]["succeeded"] == 2
