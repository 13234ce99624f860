"""The operator's create path alone: harness pods built and created as a pass does, at several concurrencies.

    .venv/bin/python bench/operator_creates.py [--pods 1000] [--workers 1,4,16,32]

Starts the test control plane with one KWOK node (pods stay Pending: no scheduling or kubelet work competes),
builds harness pods with `harness_pod` and creates them through `Kube.create_all` (the operator's pool),
`--pods` per concurrency, each run under its own names. Prints, per concurrency: pods/s, the operator-side CPU
per pod split into building the manifest and the rest of the request (serialising, TLS, reading the
response), and the API server's CPU per pod - where a pass's time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fixtures.controlplane import controlplane_bin_dir, start_control_plane  # noqa: E402


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--workers", default="1,4,16,32")
    args = ap.parse_args()

    from kubernetes import client, config

    from tracefleet.contract.job import RolloutJob
    from tracefleet.operator.children.harness import harness_pod
    from tracefleet.operator.config import OperatorConfig
    from tracefleet.operator.kube import Kube
    from tracefleet.operator.plans import job_plans, job_tasks

    wd = Path(tempfile.mkdtemp(prefix="tf-bench-creates-"))
    kube = start_control_plane(wd, controlplane_bin_dir(), node_count=1)
    try:
        apiserver = next(c for c in kube.components if c.name == "kube-apiserver").process.pid
        conf = client.Configuration()
        config.load_kube_config(config_file=str(kube.kubeconfig), client_configuration=conf)
        conf.connection_pool_maxsize = 64  # more than the most workers: no request waits for a connection
        api = client.ApiClient(conf)
        job = RolloutJob.model_validate({
            "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "bench", "namespace": "default", "uid": "00000000-0000-0000-0000-000000000000"},
            "spec": {"inference": {"managed": {"model": "Qwen/Qwen3-4B", "gpusPerReplica": 1}},
                     "harness": {"preset": "codex", "image": "reg.local/codex:1"},
                     "tasks": {"inline": [{"id": f"t{i}", "prompt": f"task {i}"} for i in range(1000)], "samplesPerTask": 10},
                     "output": {"uri": str(wd / "bucket"), "tracesPerBatch": 100}, "parallelism": 10000}})
        op_cfg = OperatorConfig()
        plans = job_plans(job, job_tasks(job))
        rows = []
        for run, workers in enumerate(int(w) for w in args.workers.split(",")):
            k = Kube(api)
            t_cpu = time.process_time()
            # each pod with the ConfigMap of its plans (children.plan_volume), as the reconcile creates them
            manifests = [m for s in range(args.pods) for child in [harness_pod(job, op_cfg, plans[s], run)]
                         for m in (*child.config_maps, child.manifest)]
            for m in manifests:
                m["metadata"].pop("ownerReferences")  # no RolloutJob exists here: nothing for the GC to collect
            build_ms = (time.process_time() - t_cpu) * 1e3 / args.pods
            a0, c0, t0 = cpu_s(apiserver), time.process_time(), time.monotonic()
            created = k.create_all(manifests, workers)
            wall = time.monotonic() - t0
            rows.append({"workers": workers, "pods_per_s": round(args.pods / wall, 1),
                         "operator_build_ms_per_pod": round(build_ms, 2),
                         "operator_request_cpu_ms_per_pod": round((time.process_time() - c0) * 1e3 / args.pods, 2),
                         "apiserver_cpu_ms_per_pod": round((cpu_s(apiserver) - a0) * 1e3 / args.pods, 2),
                         "created": sum(1 for c in created if c is not None)})
            print(json.dumps(rows[-1]), flush=True)
            time.sleep(2)  # each run its own names (attempt = run): nothing to delete in between
        print(json.dumps({"pods": args.pods, "machine_cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
                          "runs": rows}, indent=2))
        return 0
    finally:
        kube.stop()
        shutil.rmtree(wd, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
