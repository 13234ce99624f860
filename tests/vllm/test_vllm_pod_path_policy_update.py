"""Through the pod path's programs (tests/fixtures/pod_programs.py: each harness pod's sidecar and session program,
each evaluator Job's and sealer Job's program, as plain processes given what the operator writes for their
containers, `parallelism` sessions at once as the operator starts them; SeaweedFS): a RolloutJob whose engine is the
session's real vLLM (external), its sessions in flight while a trainer updates the policy through the engine only
(`tracefleet.trainer.update_policy`): no sidecar is called, and none could be (a sidecar's admin API is closed: its
token is random and known to no one).

The two `before` sessions make one short call, meet at a barrier, then stream a long call; the trainer
syncs once both are streaming (mode=keep: both calls are kept, not cut). The `after` session starts only
once a `before` session has finished (parallelism 2), so after the update, and makes one call. The job
completes; a trainer reads its batches through `BatchReader`, and every sampled token's version
(`token_versions`) is checked against the weights themselves: the engine rescores each row's tokens
(prompt logprobs) under the new weights, then under the old once they are back, and each token's logprob
is the one of the version it is labelled with. The straddling calls carry both versions. The server is
shared: its weights, label and prefix cache are put back at the end.
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from fixtures.checkpoints import changed_checkpoint
from fixtures.pod_programs import run_job_programs
from fixtures.proxy_on_vllm import RUNS_TO_CAP, served_model_dir
from tracefleet.contract import environment
from tracefleet.contract.job import RolloutJob
from tracefleet.operator.children.harness import harness_pod
from tracefleet.operator.config import OperatorConfig
from tracefleet.operator.plans import job_plans, job_tasks
from tracefleet.traces.reader import BatchReader
from tracefleet.trainer import EngineControl, update_policy

REPO = Path(__file__).resolve().parents[2]
CALC = REPO / "examples" / "quickstart" / "tasks" / "calc"
JOB = "sync"
ROLES = {"b0": "before", "b1": "before", "a0": "after"}  # task id: what its session does
BEFORE = 2
# The `before` sessions' streamed call must still be generating when the engine pauses. The trainer's steps before
# the pause (then /version and /metrics; a keep pause now counts after it) took 0.3 s on an idle machine but 2.2 s
# under the full suite on 2 cores, long enough for 36 tokens at ~60 ms a step: 160 leaves ~9 s of margin for ~7 s
# more of the test's time.
LONG_TOKENS = 160
# A sampled token's logprob as the engine reported it (decode, two requests batched) against the same token
# rescored in a prefill (prompt_logprobs) by the same weights: measured max |delta| 5.7e-6 to 1.1e-5 over 6 runs;
# the changed tensor moves most tokens' by far more than 10x this.
TOLERANCE = 1e-3

# The harness streams: in server capture the proxy asks the engine as the harness asked it, and only streamed
# tokens have arrival times to split a call at the engine's version mark (one answered whole across an update
# is flagged weight_version_unknown instead).
HARNESS = textwrap.dedent(
    """
    import json, os, pathlib, sys, time, urllib.request, uuid
    signals, role, long_prompt, long_tokens = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    me = uuid.uuid4().hex
    log = {"role": role, "started_at": time.time(), "calls": []}

    def call(content, max_tokens, marker=None):
        body = {"model": os.environ["OPENAI_MODEL"], "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": content}]}
        req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                              "Content-Type": "application/json"})
        sent, chunks, finish = time.time(), [], None
        with urllib.request.urlopen(req, timeout=120) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    sys.exit(f"error chunk: {data}")
                choice = (data.get("choices") or [{}])[0]
                finish = choice.get("finish_reason") or finish
                if (choice.get("delta") or {}).get("content"):
                    chunks.append(time.time())
                    if marker and len(chunks) == 4:
                        (signals / f"{marker}-{me}").touch()
        log["calls"].append({"sent_at": sent, "chunks": chunks, "finish_reason": finish})

    if role == "before":
        call("Say hello.", 8)
        (signals / f"ready-{me}").touch()
        deadline = time.time() + 120
        while not (signals / "go").exists():
            if time.time() > deadline:
                sys.exit("no go")
            time.sleep(0.05)
        call(long_prompt, long_tokens, marker="streaming")
    else:
        call(long_prompt, 12)
    json.dump(log, open("harness-log.json", "w"))
    """
)
EVALUATOR = textwrap.dedent(
    """
    import json
    print(json.dumps({"reward": 1.0, "harness": json.load(open("harness-log.json"))}))
    """
)


def manifest(vllm: Any, tmp: Path, output: str) -> dict[str, Any]:
    command = ["python", str(tmp / "harness.py"), str(tmp / "signals"), "{prompt}", RUNS_TO_CAP, str(LONG_TOKENS)]
    return {
        "apiVersion": "tracefleet.io/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": JOB, "namespace": "default", "uid": f"uid-{JOB}"},
        "spec": {
            "inference": {"external": {"baseUrl": vllm.url, "model": vllm.model, "logprobsMode": vllm.logprobs_mode},
                          "capture": {"mode": "server"}},
            "harness": {"preset": "command", "image": "reg.local/tracefleet:test", "command": command,
                        "sessionTimeoutSeconds": 180},
            "tasks": {"inline": [{"id": task, "prompt": role, "workspace": {"repo": str(CALC)}}
                                 for task, role in ROLES.items()],
                      "samplesPerTask": 1},
            "evaluator": {"preset": "command", "command": ["python", str(tmp / "evaluate.py")], "timeoutSeconds": 60},
            "output": {"uri": output, "credentialsSecretRef": {"name": "bucket-creds"}, "builder": "per-request",
                       "tracesPerBatch": 3},
            "parallelism": 2,
            "maxRetries": 0,
        },
    }


def wait_for(signals: Path, prefix: str, count: int, timeout_s: float = 150) -> None:
    deadline = time.monotonic() + timeout_s
    while len(list(signals.glob(f"{prefix}-*"))) < count:
        assert time.monotonic() < deadline, f"{prefix}: {sorted(p.name for p in signals.iterdir())}"
        time.sleep(0.05)


def rescored(vllm: Any, rows: list[list[int]]) -> list[np.ndarray]:
    """Each row's tokens' logprobs (position i: token i given the tokens before it; NaN at 0) under the weights
    the engine holds now: one prefill per row, nothing sampled from."""
    body = {"model": vllm.model, "prompt": rows, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
    r = httpx.post(vllm.url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    out = []
    for tokens, choice in zip(rows, sorted(r.json()["choices"], key=lambda c: c["index"]), strict=True):
        scored = zip(tokens[1:], choice["prompt_logprobs"][1:], strict=True)
        lp = [np.nan] + [entry[str(tok)]["logprob"] for tok, entry in scored]
        out.append(np.asarray(lp, dtype=np.float64))
    return out


def test_pod_path_sessions_in_flight_across_a_sync_get_true_token_versions(vllm_server: Any, s3: Any,
                                                                           tmp_path: Path) -> None:
    (tmp_path / "harness.py").write_text(HARNESS)
    (tmp_path / "evaluate.py").write_text(EVALUATOR)
    signals = tmp_path / "signals"
    signals.mkdir()
    model_dir = Path(served_model_dir(vllm_server.url))
    new_weights = changed_checkpoint(model_dir, tmp_path / "policy-1", scale=0.5)
    # the one tensor the update changes, as it was: putting it back restores the server in ~0.2 s (all 272: ~2 s)
    own_weights = changed_checkpoint(model_dir, tmp_path / "policy-0", scale=1.0)
    bucket = s3.create_bucket()
    creds = {**s3.env(), "AWS_DEFAULT_REGION": s3.region}
    engine = EngineControl(vllm_server.url)
    synced: dict[str, Any] = {}

    def trainer() -> None:  # it knows the engine's URL, nothing of the sidecars
        try:
            wait_for(signals, "ready", BEFORE)
            (signals / "go").touch()
            wait_for(signals, "streaming", BEFORE)
            synced["report"] = update_policy([vllm_server.url], new_weights, 1)
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test's thread)
            synced["error"] = exc

    started = time.monotonic()
    try:
        job = RolloutJob.model_validate(manifest(vllm_server, tmp_path, f"s3://{bucket}/out"))
        sync = threading.Thread(target=trainer, daemon=True)
        sync.start()
        run_job_programs(job, OperatorConfig(), tmp_path / "pods", creds, parallelism=job.spec.parallelism)
        sync.join(30)
        job_s = time.monotonic() - started
        assert "error" not in synced, synced.get("error")
        report = synced["report"]

        # the trainer called the engine and nothing else; no sidecar could have been called: none has an admin token
        assert {s.engine for s in report.steps} == {vllm_server.url.rstrip("/")}, report.steps
        assert report.modes == {vllm_server.url.rstrip("/"): "keep"} and report.in_flight[0].kept == BEFORE, report
        for plan in job_plans(job, job_tasks(job)):  # each harness pod as the operator builds it
            (sidecar,) = harness_pod(job, OperatorConfig(), plan, attempt=0).manifest["spec"]["initContainers"]
            assert "--admin-token" not in sidecar["args"]
            assert all(e["name"] != environment.ADMIN_TOKEN for e in sidecar["env"])

        # what a trainer reads: every row, with the version of every token
        reader = BatchReader(f"s3://{bucket}/out", JOB, **s3.bucket_options())
        rows: list[dict[str, Any]] = []
        versions: list[np.ndarray] = []
        for seq in reader.seqs():
            batch = reader.read(seq)
            t = batch.tensors(include_auxiliary=True, allow_raw_logprobs=True)  # one row per row of the table
            for i, row in enumerate(batch.table.to_pylist()):
                rows.append(row)
                versions.append(t["token_versions"][i, : len(row["tokens"])].numpy())
        assert len(rows) == 2 * BEFORE + 1, [r["session_id"] for r in rows]  # one row per call (per-request)

        new_lp = rescored(vllm_server, [r["tokens"] for r in rows])
    finally:  # the server is shared by the session's tests: its own weights, label and a clean cache back
        engine.pause("wait")
        engine.reload(str(own_weights))
        engine.set_label("default")
        engine.reset_prefix_cache()
        engine.resume()
    old_lp = rescored(vllm_server, [r["tokens"] for r in rows])
    engine.close()

    logs = {r["session_id"]: json.loads(r["metadata_json"])["extra"]["evaluation"]["details"]["harness"] for r in rows}
    update_began, update_ended = report.started_at, report.started_at + report.seconds
    shapes: Counter[tuple[int, ...]] = Counter()  # each row's versions in token order, repeats dropped
    worst = 0.0
    telling = {0: 0, 1: 0}  # sampled tokens whose logprob differs between the versions by far more than the tolerance
    for row, ver, lp_new, lp_old in zip(rows, versions, new_lp, old_lp, strict=True):
        log = logs[row["session_id"]]
        sampled = np.asarray(row["loss_mask"]) > 0
        labels = ver[sampled]
        assert (ver[~sampled] == -1).all() and set(labels.tolist()) <= {0, 1}, (row["session_id"], ver)
        if log["role"] == "before":
            assert log["started_at"] < update_began
        else:
            assert log["started_at"] > update_ended and (labels == 1).all(), (row["session_id"], labels)
        shapes[tuple(int(v) for i, v in enumerate(labels) if i == 0 or v != labels[i - 1])] += 1
        # the truth: each token's logprob is what the weights of its labelled version give it
        engine_lp = np.asarray(row["logprobs"], dtype=np.float64)[sampled]
        truth = np.where(labels == 1, lp_new[sampled], lp_old[sampled])
        other = np.where(labels == 1, lp_old[sampled], lp_new[sampled])
        worst = max(worst, float(np.abs(engine_lp - truth).max()))
        assert np.abs(engine_lp - truth).max() < TOLERANCE, (row["session_id"], labels, engine_lp - truth,
                                                             engine_lp - other)
        for v in (0, 1):
            telling[v] += int(((np.abs(truth - other) > 10 * TOLERANCE) & (labels == v)).sum())
    # the `before` sessions' short calls all old, their long calls generating when the engine paused: kept, split
    # once at the mark (old tokens, then new); the `after` session's call all new
    assert shapes == {(0,): BEFORE, (0, 1): BEFORE, (1,): 1}, shapes
    assert telling[0] > 0 and telling[1] > 0, telling
    steps = {k: round(v, 3) for k, v in report.step_seconds().items()}
    after_start = min(lg["started_at"] for lg in logs.values() if lg["role"] == "after") - update_ended
    print(f"job {job_s:.1f} s (the `after` session started {after_start:.1f} s after the update); "
          f"update {report.seconds:.2f} s (paused {report.paused_seconds:.2f} s, steps {steps}); {len(rows)} rows, "
          f"max |engine - rescored| {worst:.1e}, tokens telling the versions apart {telling}")
