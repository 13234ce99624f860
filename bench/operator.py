"""Operator bench: one 2,000-session RolloutJob on the test control plane with 100 KWOK nodes.

    .venv/bin/python bench/operator.py [--sessions 2000] [--parallelism 500] [--nodes 100]

Starts the real control plane (tests/fixtures/controlplane.py), applies the CRD, runs `tracefleet operator`
as a subprocess, creates the job (no evaluator, one batch per 100 sessions), and plays the harness pods'
part by marking Running pods Succeeded (KWOK runs nothing). Reports: time until `parallelism` pods exist
(no pod completes before that),
time until every session's pod was created, time to phase Succeeded, operator API requests per session
(from its own /metrics), operator peak RSS, and the max number of harness pods alive at once.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fixtures.controlplane import controlplane_bin_dir, free_port, start_control_plane  # noqa: E402


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def api_calls(port: int) -> float:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith("tracefleet_api_calls_total{"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--parallelism", type=int, default=500)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()

    from kubernetes import client

    from tracefleet.operator import names as n

    wd = Path(tempfile.mkdtemp(prefix="tf-bench-"))
    t0 = time.monotonic()
    kube = start_control_plane(wd, controlplane_bin_dir(), node_count=args.nodes)
    print(f"control plane with {args.nodes} KWOK nodes up in {time.monotonic() - t0:.1f} s", flush=True)
    op = None
    try:
        r = kube.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        assert r.returncode == 0, r.stderr
        api = kube.api_client()
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        mport = free_port()
        op = subprocess.Popen(
            [sys.executable, "-m", "tracefleet.operator", "--namespace", "default", "--interval", "1",
             "--max-creates", "200", "--metrics-port", str(mport), "--bind-address", "127.0.0.1", "--liveness-port", "0",
             "--log-level", "warning"],
            env={**os.environ, "KUBECONFIG": str(kube.kubeconfig)}, stdout=open(wd / "operator.log", "w"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        samples = 8
        tasks = args.sessions // samples
        body = {
            "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "bench", "namespace": "default"},
            "spec": {
                "inference": {"managed": {"model": "Qwen/Qwen3-4B", "gpusPerReplica": 1}},
                "harness": {"preset": "codex", "image": "reg.local/codex:1"},
                "tasks": {"inline": [{"id": f"t{i}", "prompt": f"task {i}"} for i in range(tasks)], "samplesPerTask": samples},
                "output": {"uri": str(wd / "bucket"), "tracesPerBatch": 100},
                "parallelism": args.parallelism,
                "maxRetries": 0,
            },
        }
        time.sleep(3)
        t_start = time.monotonic()
        custom.create_namespaced_custom_object(n.GROUP, n.VERSION, "default", n.PLURAL, body)
        sel = n.job_selector("bench", n.COMPONENT_HARNESS)
        seen: set[str] = set()
        done: set[str] = set()
        t_par = t_all = None
        max_alive = peak_rss = 0
        deadline = t_start + args.timeout
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod("default", label_selector=sel).items
            seen.update(p.metadata.name for p in pods)
            live = [p for p in pods if p.status.phase in (None, "Pending", "Running")]
            max_alive = max(max_alive, len(live))
            peak_rss = max(peak_rss, rss_kib(op.pid))
            if t_par is None and len(seen) >= min(args.parallelism, args.sessions):
                t_par = time.monotonic() - t_start
            if t_all is None and len(seen) >= args.sessions:
                t_all = time.monotonic() - t_start
            # Phase 1 (nothing completes) measures pure pod start-up up to `parallelism`; phase 2 then
            # completes Running pods as fast as this driver can, and the operator refills the slots.
            for p in live if t_par is not None else ():
                if p.status.phase == "Running" and p.metadata.name not in done:
                    core.patch_namespaced_pod_status(p.metadata.name, "default", {"status": {"phase": "Succeeded"}})
                    done.add(p.metadata.name)
            st = custom.get_namespaced_custom_object(n.GROUP, n.VERSION, "default", n.PLURAL, "bench").get("status") or {}
            sealers = client.BatchV1Api(api).list_namespaced_job("default", label_selector=n.job_selector("bench", n.COMPONENT_SEALER)).items
            if st.get("counters", {}).get("succeeded") == args.sessions and len(sealers) * 100 >= args.sessions:
                break
            time.sleep(0.5)
        t_end = time.monotonic() - t_start
        calls = api_calls(mport)
        result = {
            "sessions": args.sessions, "parallelism": args.parallelism, "nodes": args.nodes,
            "time_to_parallelism_pods_s": round(t_par or -1, 1), "time_to_all_pods_created_s": round(t_all or -1, 1),
            "time_all_sessions_succeeded_s": round(t_end, 1), "max_alive": max_alive,
            "operator_api_requests": int(calls), "api_requests_per_session": round(calls / args.sessions, 2),
            "operator_peak_rss_mib": round(peak_rss / 1024, 1), "pods_created": len(seen),
        }
        print(json.dumps(result, indent=2))
        return 0
    finally:
        if op and op.poll() is None:
            os.killpg(op.pid, signal.SIGTERM)
            op.wait(15)
        kube.stop()
        shutil.rmtree(wd, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
