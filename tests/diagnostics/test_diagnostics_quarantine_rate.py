"""What the diagnostics did, counted where a platform team looks, the same in both drivers
(tracefleet.contract.semantics, "Quarantine rate"): counts come from the sealed manifests (the operator's
bucket read gives what `tracefleet run` counts), and `tracefleet run` against the scripted engine with
the command harness prints the QuarantineRateExceeded line once when the rate crosses
spec.diagnosticsPolicy, goes on, and summarises the counters and the condition as the operator decides it."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from tracefleet.contract.semantics import DiagnosticsCounts, diagnostics_counts, quarantine_verdict
from tracefleet.bucket import LocalBucket
from tracefleet.diagnostics.base import Finding, SessionFindings
from tracefleet.operator import bucketio
from tracefleet.operator import status as st
from tracefleet.runner.tracing import SessionOutcome, session_traces
from tracefleet.traces.reader import BatchReader
from tracefleet.traces.seal import Sealer
from tracefleet.traces.synthetic import SyntheticSession

from fixtures.local_runs import calc_task, command_job, run_local



def _finding(name: str, action: str) -> Finding:
    return Finding(name=name, version="1", severity="error", message=f"{name} hit", file="test_calc.py", line=1,
                   action=action)  # type: ignore[arg-type]


def _rows(tmp_path: Path, job: str, sample: int, findings: list[Finding]) -> list[Any]:
    path = tmp_path / f"{job}-s{sample}.jsonl"
    with SyntheticSession(path, f"{job}-s{sample}", seed=sample) as sess:
        sess.call(sess.tokens(30), n_completion=8)
    outcome = SessionOutcome(job=job, session_id=f"{job}-s{sample}", task_id="t", group_id=f"{job}/t", sample_index=sample,
                             reward=1.0, evaluator_status="ok")
    return session_traces(path, outcome, findings=SessionFindings(findings=findings)).traces


def test_counts_come_from_the_manifests_and_the_operator_reads_the_same(tmp_path: Path) -> None:
    job = "counted"
    bucket = LocalBucket(tmp_path / "bucket")
    sealer = Sealer(bucket, job, spool=tmp_path / "spool")
    first = sealer.seal(
        _rows(tmp_path, job, 0, [_finding("protected_files", "quarantine"), _finding("test_skipping", "drop")])
        + _rows(tmp_path, job, 1, [_finding("protected_files", "quarantine")])
        + _rows(tmp_path, job, 2, [_finding("tool_loop", "flag")])
        + _rows(tmp_path, job, 3, []), batch_id="k8s-0")
    second = sealer.seal(_rows(tmp_path, job, 4, []) + _rows(tmp_path, job, 5, [_finding("test_skipping", "drop")]),
                         batch_id="k8s-1")
    assert (first.quarantined_sessions, first.dropped_sessions) == (2, 1)
    counts = diagnostics_counts(first)
    # by diagnostic: the quarantined (dropped) sessions with a finding of it, as the manifest counts them
    assert counts == DiagnosticsCounts(judged=4, quarantined=2, dropped=1, quarantined_by={"protected_files": 2, "test_skipping": 1},
                                       dropped_by={"protected_files": 1, "test_skipping": 1})
    total = counts + diagnostics_counts(second)
    assert total == DiagnosticsCounts(judged=6, quarantined=3, dropped=2, quarantined_by={"protected_files": 2, "test_skipping": 2},
                                      dropped_by={"protected_files": 1, "test_skipping": 2})
    assert total.rate == 0.5
    # the operator keeps these numbers with the batch it records (from the manifest in the bucket)
    for seq, manifest in ((0, first), (1, second)):
        recorded = bucketio.find_batch(str(tmp_path / "bucket"), job, f"k8s-{seq}", set())
        assert recorded is not None
        assert DiagnosticsCounts.from_json(recorded.diagnostics) == diagnostics_counts(manifest)
    assert DiagnosticsCounts.from_json(None) == DiagnosticsCounts()  # a batch recorded before the counts existed


HARNESS = textwrap.dedent(
    """
    import json, os, pathlib, urllib.request
    prompt = os.environ["TRACEFLEET_PROMPT"]
    req = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": os.environ["OPENAI_MODEL"], "max_tokens": 8,
                         "messages": [{"role": "user", "content": prompt}]}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    json.load(urllib.request.urlopen(req, timeout=60))
    if prompt.startswith("edit"):  # the failing test edited to pass
        pathlib.Path("test_calc.py").write_text("def test_add():\\n    assert True\\n")
    elif prompt.startswith("skip"):  # a conftest that skips every test
        pathlib.Path("conftest.py").write_text(
            "import pytest\\n\\ndef pytest_collection_modifyitems(items):\\n"
            "    for item in items:\\n        item.add_marker(pytest.mark.skip)\\n")
    else:  # the real fix
        src = pathlib.Path("calc.py")
        src.write_text(src.read_text().replace("return a - b", "return a + b"))
    """
)


def _rows_of(stdout: str, key: str) -> list[str]:
    return [line.strip()[len(key):].strip() for line in stdout.splitlines() if line.strip().startswith(key + " ")]


def test_local_run_warns_once_when_the_quarantine_rate_crosses_the_policy_and_goes_on(scripted_engine: Any, tmp_path: Path) -> None:
    (tmp_path / "harness.py").write_text(HARNESS)
    job = command_job(
        "hack-rate",
        # one session per task, one group per batch, run in this order: edit, skip, fix
        [calc_task(i, f"{i} it") for i in ("edit", "skip", "fix")], tmp_path / "out", per_batch=1, parallelism=1,
        diagnostics=[{"name": "protected_files", "action": "quarantine"}, {"name": "test_skipping", "action": "drop"}],
        diagnosticsPolicy={"maxQuarantineRate": 0.5, "minJudgedSessions": 2})
    done, _ = run_local(job, tmp_path, engine_url=str(scripted_engine.url), timeout_s=300)
    assert done.returncode == 0, done.stdout + done.stderr  # the job goes on: the fix after the warning is sealed too

    # after the second batch: 2 of 2 judged, over 0.5: one line, said once (the third batch keeps it over)
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line]
    assert warnings == [
        "tracefleet: WARNING QuarantineRateExceeded: 2 of 2 judged sessions quarantined (100%, 1 of them dropped) > "
        "maxQuarantineRate 0.5; by diagnostic: protected_files 1, test_skipping 1 (the job goes on: quarantined sessions "
        "are left out of training)"], done.stderr
    assert _rows_of(done.stdout, "diagnostics") == ["judged 3, quarantined 2, dropped 1 (sessions in sealed batches)"], done.stdout
    (condition,) = _rows_of(done.stdout, "quarantine")

    # the operator's decision over the same sealed manifests says exactly that
    reader = BatchReader(str(tmp_path / "out"), "hack-rate")
    assert len(reader.seqs()) == 3
    counts = sum((diagnostics_counts(reader.manifest(s)) for s in reader.seqs()), DiagnosticsCounts())
    cond = st.quarantine_condition(counts, 0.5, 2)
    assert cond is not None and cond.status == st.TRUE and cond.reason == st.REASON_QUARANTINE_RATE_ABOVE
    assert condition == f"QuarantineRateExceeded=True ({cond.reason}): {cond.message}"
    assert cond.message == ("2 of 3 judged sessions quarantined (67%, 1 of them dropped) > maxQuarantineRate 0.5; "
                            "by diagnostic: protected_files 1, test_skipping 1")
    trained = sorted(t for s in reader.seqs() for t in reader.read(s).training_table().column("task_id").to_pylist())
    assert trained == ["fix"]

    # a rerun finds every session sealed and reports the job's counts and condition all the same
    again, _ = run_local(job, tmp_path, engine_url=str(scripted_engine.url), timeout_s=300)
    assert again.returncode == 0, again.stderr
    assert _rows_of(again.stdout, "diagnostics") == ["judged 3, quarantined 2, dropped 1 (sessions in sealed batches)"]
    assert _rows_of(again.stdout, "quarantine") == [condition]
    assert quarantine_verdict(counts, 0.5, 2).exceeded
