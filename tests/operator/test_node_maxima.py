"""Plans at the schema's maxima reach their pods on the real node (tests/fixtures/node.py, the chart and the bucket of
tests/fixtures/node_jobs.py), where one environment variable over 128 KiB (Linux's MAX_ARG_STRLEN) kept a process
from starting at all.

- A RolloutJob whose task's prompt has the schema's most characters (262,144, four UTF-8 bytes each: 1 MiB), applied
  with kubectl: its plan reaches the harness pod, the evaluator Job and the sealer Job as ConfigMap files (split,
  being over a ConfigMap's 1 MiB), the harness (a `command` program) reads the prompt from TRACEFLEET_PROMPT_FILE,
  and the proxy's capture in the bucket holds it as the model received it.
- The sealer Job of one group at the schema's most samples per task (1,024 sessions sealed in one batch, its plans
  ~310 bytes a session), built by the operator's own `sealer_job` and run from the chart's image: it reads every
  session's plan and seals 1,024 rows. (A whole job of 1,024 harness pods does not fit a test on one 2-core node.)

Measured (2 cores, shared): the longest prompt's job from `kubectl apply` to its sealed batch in 12.5-17.4 s, to
Succeeded in 15.6-20.5 s; the 1,024 sessions' plans (1,405,695 bytes in two ConfigMaps) sealed in 22.9 s.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.engines import EngineProcess
from fixtures.node_jobs import CALLING_HARNESS, NAMESPACE, REFS, Installed, run_job, wait_for
from tracefleet.bucket import open_bucket
from tracefleet.contract import environment, layout
from tracefleet.contract.capture import read_capture_log
from tracefleet.contract.job import RolloutJob
from tracefleet.operator import names as n
from tracefleet.operator.children.jobs import sealer_job
from tracefleet.operator.config import OperatorConfig
from tracefleet.operator.plans import job_plans, job_tasks
from tracefleet.traces.reader import BatchReader

LONGEST = "\U0001F600" * 262144  # tracefleet.contract.job.InlineTask.prompt's max_length
MOST_SAMPLES = 1024  # tracefleet.contract.job.Tasks.samples_per_task's maximum
HARNESS = CALLING_HARNESS + f"""
assert "{environment.HARNESS_PROMPT}" not in os.environ  # one environment entry cannot hold it
assert prompt == "\\U0001F600" * 262144, len(prompt)
call(prompt)
"""


@pytest.fixture(scope="module")
def long_context_engine(node) -> Iterator[EngineProcess]:
    """The scripted engine on this machine's address, with a context that holds the longest prompt's tokens."""
    engine = EngineProcess(["--backend", "scripted", "--model", "smollm2", "--max-model-len", str(4 * 1024 * 1024)],
                           host=node.host)
    yield engine
    engine.stop()


def spec(engine_url: str, uri: str, *, prompt: str, samples: int) -> dict:
    return {
        "inference": {"external": {"baseUrl": engine_url}, "capture": {"mode": "server"}},
        "harness": {"preset": "command", "command": ["python", "-c", HARNESS], "sessionTimeoutSeconds": 180},
        "tasks": {"inline": [{"id": "longest", "prompt": prompt}], "samplesPerTask": samples},
        "evaluator": {"preset": "command", "timeoutSeconds": 60, "command": ["true"]},
        "output": {"uri": uri, "tracesPerBatch": samples, "credentialsSecretRef": {"name": "bucket-credentials"}},
    }


def test_the_longest_prompt_reaches_the_harness_on_the_real_node(node, installed: Installed, long_context_engine,
                                                                  cluster_s3, tmp_path: Path) -> None:
    job = "longest-prompt"
    uri = f"s3://{installed.bucket}/{job}"
    manifest = {"apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": job},
                "spec": spec(long_context_engine.url, uri, prompt=LONGEST, samples=1)}
    status, reader = run_job(node, installed, cluster_s3, manifest, server_side=True)  # over 256 KiB
    assert status["counters"]["succeeded"] == 1
    (seq,) = reader.seqs()
    (trace,) = reader.read(seq).traces()
    assert trace.meta.reward == 1.0 and int(trace.loss_mask.sum()) > 0
    capture = tmp_path / layout.CAPTURE_LOG
    capture.write_bytes(open_bucket(uri, **cluster_s3.bucket_options()).get(layout.capture_key(job, 0)))
    (record,) = read_capture_log(capture).records
    (message,) = (record.canonical or {})["messages"]
    assert "".join(p["text"] for p in message["parts"]) == LONGEST
    # run_job deleted it: a spec this large once kept kopf from removing the finalizer (its diffbase annotation)
    wait_for(f"{job} deleted", lambda: installed.status(job) is None, 60, report=installed.operator_log)


def test_a_sealer_of_the_most_samples_per_task_on_the_real_node(node, installed: Installed, cluster_s3) -> None:
    name = "most-samples"
    uri = f"s3://{installed.bucket}/{name}"
    job = RolloutJob.model_validate({
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec("http://engine.invalid:8000", uri, prompt="Say something.", samples=MOST_SAMPLES)})
    plans = job_plans(job, job_tasks(job))
    assert len(plans) == MOST_SAMPLES
    child = sealer_job(job, OperatorConfig(proxy_image=REFS[0]), 0, plans)
    plan_bytes = sum(len(v.encode()) for cm in child.config_maps for v in cm["data"].values())
    kube = node.kube
    started = time.monotonic()
    try:
        for obj in [*child.config_maps, child.manifest]:
            obj["metadata"].pop("ownerReferences")  # no RolloutJob owns them here: the test deletes them
            r = kube.kubectl("create", "-n", NAMESPACE, "-f", "-", input=json.dumps(obj))  # as the operator does
            assert r.returncode == 0, r.stderr
        job_name = child.manifest["metadata"]["name"]

        def ended() -> str | None:
            r = kube.kubectl("-n", NAMESPACE, "get", "job", job_name, "-o", "json")
            conditions = (json.loads(r.stdout).get("status") or {}).get("conditions") or []
            ends = [c["type"] for c in conditions if c["status"] == "True" and c["type"] in ("Complete", "Failed")]
            return ends[0] if ends else None

        outcome = wait_for(f"sealer Job {job_name}", ended, 300, every_s=1)
        took = time.monotonic() - started
        logs = kube.kubectl("-n", NAMESPACE, "logs", f"job/{job_name}").stdout
        print(f"{name}: {MOST_SAMPLES} sessions' plans ({plan_bytes} bytes in {len(child.config_maps)} ConfigMap(s)) "
              f"sealed in {took:.1f} s; {logs.strip().splitlines()[-1:]}")
        assert outcome == "Complete", logs[-3000:]
        pods = {p: installed.pods.last[p] for p in installed.pods.phases
                if installed.pods.last[p].metadata.labels.get("job-name") == job_name}
        assert pods and all(installed.pods.phases[p][-1] == "Succeeded" for p in pods), installed.pods.phases
        reader = BatchReader(open_bucket(uri, **cluster_s3.bucket_options()), name)
        (seq,) = reader.seqs()
        traces = reader.read(seq).traces()
        assert len(traces) == MOST_SAMPLES  # every session sealed (none ran: rows without tokens)
        assert sorted(t.meta.sample_index for t in traces) == list(range(MOST_SAMPLES))
    finally:
        kube.kubectl("-n", NAMESPACE, "delete", "job,configmap", "-l", f"{n.LABEL_JOB}={name}", "--wait=false",
                     "--cascade=background")
