"""Operator bench: one RolloutJob of N sessions on the test control plane with KWOK nodes.

    .venv/bin/python bench/operator.py [--sessions 2000] [--parallelism 500] [--nodes 100] [--replicas 1]

Starts the real control plane (tests/fixtures/controlplane.py), applies the CRD, runs `tracefleet operator`
as a subprocess (`--replicas 2`: two of them with `--leader-elect`, as the chart runs them), creates the job
(no evaluator, one batch per 100 sessions), and plays the harness pods' part by marking Running pods
Succeeded (KWOK runs nothing) from a watch, so the driver stays light beside the operator on a small machine.

Reports: pods/s from the job's creation until `parallelism` pods exist (no pod completes before that) and
from the first pod to the last; time until every session succeeded; operator API requests per session
(every request the operator makes - its own calls, lease renewals and the status writes kopf sends for it -
from its /metrics; kopf's RolloutJob watch streams are not counted); operator RSS at the start, when 25/50/75/100 %
of the sessions were done, and at the end; its CPU seconds; the machine's load average and CPU count.
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
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fixtures.controlplane import controlplane_bin_dir, free_port, start_control_plane  # noqa: E402

LEASE_NAMESPACE = "default"


def proc_stat(pid: int) -> tuple[int, float]:
    """(RSS KiB, CPU seconds) of a process."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return rss, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def api_calls(port: int, kind: str = "") -> float:
    """Requests an operator sent (of one kind, e.g. "leases"), from its /metrics."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    lines = [l for l in text.splitlines() if l.startswith("tracefleet_api_calls_total{")]
    return sum(float(l.rsplit(" ", 1)[1]) for l in lines if not kind or f'kind="{kind}"' in l)


def reconcile_seconds(port: int) -> dict[str, float]:
    """Passes an operator ran and the seconds they took, from its /metrics."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    got = {l.split(" ")[0]: float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
           if l.startswith(("tracefleet_reconcile_seconds_sum", "tracefleet_reconcile_seconds_count"))}
    return {"passes": got.get("tracefleet_reconcile_seconds_count", 0), "seconds": round(got.get("tracefleet_reconcile_seconds_sum", 0), 1)}


class Driver:
    """Watches the job's harness pods (raw JSON, no client models): notes when each first appears and,
    once `complete` is set, marks Running pods Succeeded from a small pool (what a finished harness does)."""

    def __init__(self, api, selector: str) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.selector = selector
        self.first_seen: dict[str, float] = {}
        self.alive: set[str] = set()
        self.max_alive = 0
        self.completed = 0
        self.complete = threading.Event()
        self.stop = threading.Event()
        self._marked: set[str] = set()
        self._running: list[str] = []
        self._pool = ThreadPoolExecutor(8)
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def _finish(self, name: str) -> None:
        self.core.patch_namespaced_pod_status(name, "default", {"status": {"phase": "Succeeded"}}, _preload_content=False)
        with self._lock:
            self.completed += 1

    def _mark(self, name: str) -> None:
        if name not in self._marked:
            self._marked.add(name)
            self._pool.submit(self._finish, name)

    def release(self) -> None:
        """Start completing pods (those already Running first)."""
        self.complete.set()
        with self._lock:
            running, self._running = self._running, []
        for name in running:
            self._mark(name)

    def _watch(self) -> None:
        rv = ""
        while not self.stop.is_set():
            try:
                resp = self.core.list_namespaced_pod("default", label_selector=self.selector, watch=True, resource_version=rv,
                                                     allow_watch_bookmarks=True, timeout_seconds=120, _preload_content=False)
                for line in resp:
                    ev = json.loads(line)
                    obj = ev["object"]
                    rv = obj["metadata"].get("resourceVersion", rv)
                    if ev["type"] in ("BOOKMARK", "ERROR"):
                        if ev["type"] == "ERROR":
                            rv = ""
                        continue
                    name, phase = obj["metadata"]["name"], (obj.get("status") or {}).get("phase")
                    self.first_seen.setdefault(name, time.monotonic())
                    if ev["type"] == "DELETED" or phase in ("Succeeded", "Failed"):
                        self.alive.discard(name)
                        continue
                    self.alive.add(name)
                    self.max_alive = max(self.max_alive, len(self.alive))
                    if phase == "Running":
                        if self.complete.is_set():
                            self._mark(name)
                        else:
                            with self._lock:
                                self._running.append(name)
            except Exception as e:  # noqa: BLE001 - a dropped watch is resumed
                print(f"driver watch: {e!r}", flush=True)
                time.sleep(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--parallelism", type=int, default=500)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--replicas", type=int, default=1, choices=(1, 2), help="operator processes (2: --leader-elect)")
    ap.add_argument("--interval", type=float, default=1.0, help="the operator's --interval")
    ap.add_argument("--max-creates", type=int, default=500, help="the operator's --max-creates")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()

    from kubernetes import client

    from tracefleet.operator import names as n

    wd = Path(tempfile.mkdtemp(prefix="tf-bench-"))
    t0 = time.monotonic()
    kube = start_control_plane(wd, controlplane_bin_dir(), node_count=args.nodes)
    print(f"control plane with {args.nodes} KWOK nodes up in {time.monotonic() - t0:.1f} s", flush=True)
    ops: list[tuple[subprocess.Popen, int]] = []
    driver = None
    try:
        r = kube.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        assert r.returncode == 0, r.stderr
        api = kube.api_client()
        custom = client.CustomObjectsApi(api)
        for i in range(args.replicas):
            mport = free_port()
            ha = ["--leader-elect", "--lease-namespace", LEASE_NAMESPACE, "--lease-identity", f"bench-{i}"] if args.replicas > 1 else []
            op = subprocess.Popen(
                [sys.executable, "-m", "tracefleet.operator", "--namespace", "default", "--interval", str(args.interval),
                 "--max-creates", str(args.max_creates), "--metrics-port", str(mport), "--bind-address", "127.0.0.1",
                 "--liveness-port", "0", "--log-level", "warning", *ha],
                env={**os.environ, "KUBECONFIG": str(kube.kubeconfig)}, stdout=open(wd / f"operator-{i}.log", "w"),
                stderr=subprocess.STDOUT, start_new_session=True,
            )
            ops.append((op, mport))
        samples = max(8, -(-args.sessions // 1000))  # spec.tasks.inline holds at most 1,000 tasks
        tasks = args.sessions // samples
        sessions = tasks * samples
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
        time.sleep(5)
        rss_start = {i: proc_stat(op.pid)[0] for i, (op, _) in enumerate(ops)}
        cpu_start = {i: proc_stat(op.pid)[1] for i, (op, _) in enumerate(ops)}
        load_start = os.getloadavg()
        cp_cpu_start = {c.name: proc_stat(c.process.pid)[1] for c in kube.components}
        self_cpu_start = time.process_time()
        driver = Driver(api, n.job_selector("bench", n.COMPONENT_HARNESS))
        t_start = time.monotonic()
        custom.create_namespaced_custom_object(n.GROUP, n.VERSION, "default", n.PLURAL, body)
        t_par = t_all = None
        peak_rss = dict(rss_start)
        rss_at: dict[str, dict[int, float]] = {}
        loads: list[float] = []
        succeeded = 0
        deadline = t_start + args.timeout
        last_status = 0.0
        while time.monotonic() < deadline:
            seen = len(driver.first_seen)
            for i, (op, _) in enumerate(ops):
                if op.poll() is None:
                    peak_rss[i] = max(peak_rss[i], proc_stat(op.pid)[0])
            if t_par is None and seen >= min(args.parallelism, sessions):
                t_par = time.monotonic() - t_start
                driver.release()  # phase 2: complete Running pods; the operator refills the slots
            if t_all is None and seen >= sessions:
                t_all = time.monotonic() - t_start
            for q in (25, 50, 75, 100):
                if str(q) not in rss_at and driver.completed >= sessions * q // 100:
                    rss_at[str(q)] = {i: round(proc_stat(op.pid)[0] / 1024, 1) for i, (op, _) in enumerate(ops) if op.poll() is None}
            if time.monotonic() - last_status > 2:
                last_status = time.monotonic()
                loads.append(os.getloadavg()[0])
                st = custom.get_namespaced_custom_object(n.GROUP, n.VERSION, "default", n.PLURAL, "bench").get("status") or {}
                succeeded = st.get("counters", {}).get("succeeded", 0)
                sealers = client.BatchV1Api(api).list_namespaced_job(
                    "default", label_selector=n.job_selector("bench", n.COMPONENT_SEALER), _preload_content=False)
                if succeeded == sessions and len(json.loads(sealers.data)["items"]) * 100 >= sessions:
                    break
            time.sleep(0.2)
        t_end = time.monotonic() - t_start
        time.sleep(3)  # the end state's RSS, after the last pass
        calls = sum(api_calls(port) for op, port in ops if op.poll() is None)
        lease_calls = sum(api_calls(port, "leases") for op, port in ops if op.poll() is None)
        first = sorted(driver.first_seen.values())
        span = (first[-1] - first[0]) if len(first) > 1 else 0.0
        result = {
            "sessions": sessions, "parallelism": args.parallelism, "nodes": args.nodes, "replicas": args.replicas,
            "operator_interval_s": args.interval, "operator_max_creates": args.max_creates,
            "time_to_parallelism_pods_s": round(t_par or -1, 1),
            "pods_per_s_to_parallelism": round(min(args.parallelism, sessions) / t_par, 1) if t_par else None,
            "time_to_all_pods_created_s": round(t_all or -1, 1),
            "pods_per_s_first_to_last": round((len(first) - 1) / span, 1) if span else None,
            "time_all_sessions_succeeded_s": round(t_end, 1), "succeeded_in_status": succeeded,
            "max_alive": driver.max_alive, "pods_created": len(first),
            "operator_api_requests": int(calls), "api_requests_per_session": round(calls / sessions, 3),
            # the Lease's renewals and the standby's reads: per second of the job, not per session
            "of_which_lease_requests": int(lease_calls), "lease_requests_per_s": round(lease_calls / t_end, 2),
            "operator_rss_mib_start": {i: round(v / 1024, 1) for i, v in rss_start.items()},
            "operator_rss_mib_at_pct_done": rss_at,
            "operator_rss_mib_end": {i: round(proc_stat(op.pid)[0] / 1024, 1) for i, (op, _) in enumerate(ops) if op.poll() is None},
            "operator_rss_mib_peak": {i: round(v / 1024, 1) for i, v in peak_rss.items()},
            "operator_cpu_s": {i: round(proc_stat(op.pid)[1] - cpu_start[i], 1) for i, (op, _) in enumerate(ops) if op.poll() is None},
            # where the machine's time went during the job: CPU seconds of each process
            "cpu_s_during_job": {**{c.name: round(proc_stat(c.process.pid)[1] - cp_cpu_start[c.name], 1) for c in kube.components},
                                 "bench-driver": round(time.process_time() - self_cpu_start, 1)},
            "operator_reconcile": {i: reconcile_seconds(port) for i, (op, port) in enumerate(ops) if op.poll() is None},
            "machine_cpus": os.cpu_count(), "load_avg_1m_start": round(load_start[0], 2),
            "load_avg_1m_during_max": round(max(loads), 2) if loads else None,
            "load_avg_1m_end": round(os.getloadavg()[0], 2),
        }
        print(json.dumps(result, indent=2))
        return 0
    finally:
        if driver is not None:
            driver.stop.set()
        for op, _ in ops:
            if op.poll() is None:
                os.killpg(op.pid, signal.SIGTERM)
                try:
                    op.wait(15)
                except subprocess.TimeoutExpired:  # a standby blocked in its wait: nothing to lose
                    os.killpg(op.pid, signal.SIGKILL)
        kube.stop()
        shutil.rmtree(wd, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
