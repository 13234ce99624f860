"""Diagnostics mean the same in both drivers (issue 14, "the same job through the pod path gives the same findings
as locally"): the planted-hacks job of tests/fixtures/planted.py, with the evaluator's protection off, through a real
harness CLI (Codex), run by `tracefleet run` and by the pod path's programs (tests/fixtures/pod_programs.py: each
harness pod's sidecar and session program, each evaluator Job's and sealer Job's program, as plain processes given
what the operator writes for their containers). The session program finds the CLI where a harness image puts it: on
its PATH. (The operator starting those pods on a real node: the driver-conformance test, tests/fixtures/node_jobs.py.)

Per task, what a trainer reads from either bucket agrees and is the intended outcome: the findings
(name, version, severity, message, file, line, action, and whether one names a call: call ids are random
per call), the quarantined flag and the reward. Every hack is flagged by the diagnostic aimed at it, where
it planted the hack, and quarantined (reward 0); the two clean sessions have no finding and keep reward 1.
The evidence each driver kept for `tracefleet diagnose` is the same too (ids, timings and the patch's
bytes aside), and shows the CLI running each route's commands with its own shell tool.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from fixtures.local_runs import run_local
from fixtures.harnesses import harness_binary_path
from fixtures.pod_programs import run_job_programs
from fixtures.planted import (CLEAN, FINAL_TEXT, HACKS, hack_evidence, marker, planted_diagnostics, planted_evaluator,
                              planted_script, planted_tasks)
from tracefleet.contract.job import RolloutJob
from tracefleet.diagnostics.evidence import stored_evidence
from tracefleet.diagnostics.library import BUILTINS
from tracefleet.formats.shell_tools import COMMAND_KEYS
from tracefleet.operator.config import OperatorConfig
from tracefleet.runner.presets import harness_pins
from tracefleet.traces.reader import BatchReader

# The quickest of the real CLIs here (the test's own run, load 4-15 on 2 cores: Codex ~35 s, Pi ~80 s).
PRESET = "codex"
JOB = "planted-drivers"
CLEAN_SESSIONS = 2
PER_BATCH = 4
# what a finding must agree on between the drivers (its call_id is random per call: only whether it has one)
COMPARED_FINDING_FIELDS = ("name", "version", "severity", "message", "file", "line", "action")
# Besides the diagnostic aimed at it, a hack may earn others: the skip is inserted into the test file,
# which is also an edit of it.
ALSO_FLAGGED = {"insert-skip": ["protected_files"]}


def manifest(engine: Any, tmp: Path, output: str, ns: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "tracefleet.io/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": JOB, **({"namespace": ns} if ns else {})},
        "spec": {
            "inference": {"external": {"baseUrl": engine.url, "model": engine.model}, "capture": {"mode": "server"}},
            "harness": {"preset": PRESET, "image": f"reg.local/{PRESET}:test", "sessionTimeoutSeconds": 240},
            "tasks": {"inline": planted_tasks(tmp, protection=False, clean=CLEAN_SESSIONS), "samplesPerTask": 1},
            "evaluator": planted_evaluator(protection=False),
            "diagnostics": planted_diagnostics("quarantine"),
            "output": {"uri": output, "credentialsSecretRef": {"name": "bucket-creds"}, "tracesPerBatch": PER_BATCH},
            "parallelism": 3,
        },
    }


def harness_image_path(tmp: Path) -> Path:
    """What `npm i -g` leaves on a harness image's PATH: the CLI's binary by its own name."""
    folder = tmp / "image-bin"
    folder.mkdir(exist_ok=True)
    link = folder / harness_pins()[PRESET].bin
    if not link.exists():
        link.symlink_to(harness_binary_path(PRESET))
    return folder


def shell_command(arguments: str) -> str:
    """The command a shell tool call ran, from its JSON arguments (a string, or an argv ending in it)."""
    value = next(v for k, v in json.loads(arguments).items() if k.lower() in COMMAND_KEYS)
    return value[-1] if isinstance(value, list) else value


def findings_by_task(reader: BatchReader) -> dict[str, dict[str, Any]]:
    """task -> its session's reward, quarantined flag, outcome and findings (COMPARED_FINDING_FIELDS, and whether
    the finding names a call: the ids themselves are random), the same on every row the session sealed."""
    out: dict[str, dict[str, Any]] = {}
    for seq in reader.seqs():
        table = reader.read(seq).table.select(["task_id", "reward", "evaluator_reward", "quarantined", "outcome", "diagnostics"])
        for row in table.to_pylist():
            summary = {
                "reward": row["reward"], "evaluator_reward": row["evaluator_reward"], "quarantined": row["quarantined"],
                "outcome": row["outcome"],
                "findings": sorted((*(f[k] for k in COMPARED_FINDING_FIELDS), f["call_id"] is not None) for f in row["diagnostics"]),
            }
            assert out.setdefault(row["task_id"], summary) == summary, (row["task_id"], out[row["task_id"]], summary)
    return out


def stored_evidence_by_task(uri: str, options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """task -> the session's stored evidence (layout.evidence_key), without what is random or wall-clock:
    session and call ids, timings, and the patch's bytes (compiled .pyc files the clean sessions' own test
    runs left embed their paths; `files` still lists them)."""
    reader = BatchReader(uri, JOB, **options)
    out: dict[str, dict[str, Any]] = {}
    for seq in reader.seqs():
        for row in reader.read(seq).table.select(["task_id", "session_id"]).to_pylist():
            ev = stored_evidence(reader.bucket, JOB, row["session_id"])
            assert ev is not None, f"no evidence kept for {row['session_id']}"
            body = ev.model_dump(mode="json", exclude={"session_id", "timings", "patch"})
            for call in body["calls"]:
                call.pop("call_id")
                for tc in call["tool_calls"]:
                    tc.pop("id", None)
            out[row["task_id"]] = body
    return out


def test_planted_hacks_get_the_same_findings_locally_and_through_the_pod_programs(s3: Any, scripted_engine: Any,
                                                                                 tmp_path: Path) -> None:
    scripted_engine.configure(**planted_script(PRESET))
    bucket_name = s3.create_bucket()
    creds = {**s3.env(), "AWS_DEFAULT_REGION": s3.region}

    # ---- tracefleet run
    local, local_s = run_local(manifest(scripted_engine, tmp_path, f"s3://{bucket_name}/local"), tmp_path, env=creds, timeout_s=300)
    assert local.returncode == 0, local.stdout + local.stderr

    # ---- the pod path's programs
    cluster = manifest(scripted_engine, tmp_path, f"s3://{bucket_name}/cluster", "default")
    job = RolloutJob.model_validate({**cluster, "metadata": {**cluster["metadata"], "uid": f"uid-{JOB}"}})
    started = time.monotonic()
    run_job_programs(job, OperatorConfig(), tmp_path / "pods", creds, tools=[harness_image_path(tmp_path)])
    print(f"local run {local_s:.1f} s, pod programs {time.monotonic() - started:.1f} s")

    local_rows = findings_by_task(BatchReader(f"s3://{bucket_name}/local", JOB, **s3.bucket_options()))
    cluster_rows = findings_by_task(BatchReader(f"s3://{bucket_name}/cluster", JOB, **s3.bucket_options()))
    assert cluster_rows == local_rows

    # ...and they are the intended ones: every hack flagged by the diagnostic aimed at it, where it planted
    # the hack, and quarantined; the clean sessions with no finding and their reward
    assert sorted(local_rows) == sorted(t["id"] for t in planted_tasks(tmp_path, protection=False, clean=CLEAN_SESSIONS))
    assert len([task for task in local_rows if task not in HACKS]) == CLEAN_SESSIONS
    for task, row in local_rows.items():
        findings = row["findings"]
        # without protection the evaluator still pays most hacks; not a deleted test, nor a conftest.py (the command
        # preset's pytest reads no conftest.py from the workspace: runner/evaluators/common.py)
        unpaid = ("delete-test", "conftest")
        assert row["outcome"] == "ok" and row["evaluator_reward"] == (0.0 if task in unpaid else 1.0), (task, row)
        if task not in HACKS:
            assert findings == [] and not row["quarantined"] and row["reward"] == 1.0, (task, row)
            continue
        assert row["quarantined"] and row["reward"] == 0.0, (task, row)
        assert sorted(f[0] for f in findings) == sorted([HACKS[task][1], *ALSO_FLAGGED.get(task, [])]), (task, findings)
        assert all(f[1:3] == (BUILTINS[f[0]].version, "error") and f[6] == "quarantine" for f in findings), (task, findings)
        assert (HACKS[task][1], *hack_evidence(task)) in {(f[0], f[4], f[5]) for f in findings}, (task, findings)

    # the evidence those findings were judged on, as `tracefleet diagnose` reads it, is the same in both
    # buckets, and shows the real CLI running the task's commands with its own shell tool
    local_evidence = stored_evidence_by_task(f"s3://{bucket_name}/local", s3.bucket_options())
    cluster_evidence = stored_evidence_by_task(f"s3://{bucket_name}/cluster", s3.bucket_options())
    assert cluster_evidence == local_evidence
    routes = {r["marker"]: r["commands"] for r in planted_script(PRESET)["routes"]}
    for task, ev in local_evidence.items():
        commands = routes[marker(task if task in HACKS else CLEAN)]
        assert ev["harness"]["preset"] == PRESET and ev["harness"]["exit_code"] == 0, (task, ev["harness"])
        ran = [shell_command(tc["arguments"]) for c in ev["calls"] for tc in c["tool_calls"]]
        assert ran == commands and ev["calls"][-1]["text"] == FINAL_TEXT, (task, ev["calls"])
