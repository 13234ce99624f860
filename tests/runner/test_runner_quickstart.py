"""The README's main job, run as a new user runs it: `tracefleet run examples/quickstart/job.yaml` starts
the real CPU engine (SmolLM2-135M-Instruct on llama.cpp), the proxy, the example agent and the tests
evaluator, and leaves batches the trainer reader can read, with trainable tokens, the evaluator's rewards,
and learning signal: real samples that succeed sometimes, so some group's GRPO advantages are not 0. It runs
as the quickstart door installs it: with an empty cache and no torch (nor transformers) importable."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fixtures.import_guard import attempts, blocking_env
from fixtures.scripts import script_module
from tracefleet.contract.semantics import OutcomeKind
from tracefleet.traces.reader import BatchReader

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quickstart_produces_a_readable_batch_with_learning_signal(tmp_path: Path) -> None:
    # The example as shipped, with 6 samples per task instead of 4: a group with no spread at all then
    # needs all 6 samples alike in each of the 3 groups (under 1 in 1000 at the rates SmolLM2 shows).
    example = tmp_path / "quickstart"
    shutil.copytree(REPO / "examples" / "quickstart", example)
    job = yaml.safe_load((example / "job.yaml").read_text())
    job["spec"]["tasks"]["samplesPerTask"] = 6
    (example / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    done = subprocess.run(
        [sys.executable, "-m", "tracefleet.cli", "run", str(example / "job.yaml"), "--work-dir", str(tmp_path / "work")],
        cwd=tmp_path, capture_output=True, text=True, timeout=840,
        # a fresh cache: the engine converts SmolLM2's tokenizer in this run, as on a newcomer's machine
        env={**blocking_env(tmp_path / "blocked.log", "torch", "transformers"), "TRACEFLEET_CACHE": str(tmp_path / "cache")},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert not attempts(tmp_path / "blocked.log"), attempts(tmp_path / "blocked.log")
    # Every session ran to its end. The model's code is its own: an answer that loops forever (seen once, in CI,
    # 2026-12-01) is the policy's failure, sealed with reward 0 and trained on. None is the
    # infrastructure's, and the run completes nearly all of them.
    status = re.search(r"status         completed (\d+)(?:, the policy's failures (\d+) \([^)]*\))?\n", output)
    assert status and int(status.group(1)) >= 16 and int(status.group(1)) + int(status.group(2) or 0) == 18, output
    # capture mode auto (the default) picks exact for SmolLM2 (ChatML) and says so
    assert "capture mode exact (the model's family is supported)" in output, output
    reader = BatchReader(tmp_path / "tracefleet-output", "quickstart")
    batches = [reader.read(seq) for seq in reader.seqs()]
    traces = [t for b in batches for t in b.traces()]
    assert batches and traces
    assert sum(t.num_trainable for t in traces) > 0
    sessions = {t.meta.session_id for t in traces}
    # Exact capture: each session's calls extend each other token for token and merge into one trace.
    assert len(traces) == len(sessions), [t.call_ids for t in traces]
    assert len(sessions) == 18 and {t.meta.task_id for t in traces} == {"add", "shout", "total"}
    # Every completed session was judged by the tests evaluator: a reward (0 or 1), no fail-closed marks; one the
    # policy failed (its code looped past a time limit) is sealed as the policy's, with reward 0.
    assert all((t.meta.reward in (0.0, 1.0) and t.meta.outcome == "ok")
               or (t.meta.reward == 0.0 and t.meta.outcome_kind == OutcomeKind.POLICY) for t in traces), \
        [(t.meta.session_id, t.meta.outcome, t.meta.outcome_kind) for t in traces]
    assert all(t.meta.model == "smollm2" for t in traces)
    # Learning signal, as the trainer reads it: some group's samples scored differently, so its GRPO
    # advantages are not 0; the summary says how many groups carry it.
    with_signal = {t.meta.group_id for b in batches for t, a in zip(b.traces(), b.advantages()) if a != 0}
    spread = {g for g in {t.meta.group_id for t in traces}
              if len({t.meta.reward for t in traces if t.meta.group_id == g}) > 1}
    assert with_signal and with_signal == spread, ([(t.meta.group_id, t.meta.reward) for t in traces])
    assert re.search(rf"reward spread  rewards 0\.\.1 \(std 0\.\d\d\); {len(spread)} of 3 groups \(\d+%\) have "
                     r"non-zero advantages", output), output
    inspect = f"tracefleet traces ls {tmp_path / 'tracefleet-output'} --job quickstart"
    assert inspect in output
    listing = subprocess.run([sys.executable, "-m", "tracefleet.cli", *inspect.split()[1:]],
                             capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0 and re.search(r"^\s+0\s+\d+\s+\d+", listing.stdout, re.M), listing
    # The summary counts the sessions a diagnostic flagged, as the batches hold them; the example's own sessions
    # earn their rewards honestly (the answer ends with its code block, within the token cap): a rewarded answer
    # cut at the cap (`failure_rewarded`, 4 of 12 sessions when the cap was 64 and nothing stopped the prose) is
    # an error finding, and the quickstart raises none: the agent never writes a code block the cap cut (a cut one
    # still passed its tests once in some 20 runs of 18 sessions when it did, 2026-12-01; 11 of 180 calls are cut).
    flagged = {t.meta.session_id for t in traces if t.meta.diagnostics}
    errors = {t.meta.session_id for t in traces if any(f["severity"] == "error" for f in t.meta.diagnostics)}
    row = "none of the 18 sessions run now flagged" if not flagged else f"{len(flagged)} of the 18 sessions run now flagged: "
    assert f"findings       {row}" in output, output
    assert not errors, [(t.meta.session_id, t.meta.diagnostics) for t in traces if t.meta.session_id in errors]
    first_trainer_step(tmp_path)


def readme_snippet(name: str) -> str:
    """The ```python block after `<!-- snippet: NAME -->` in README.md."""
    text = (REPO / "README.md").read_text()
    match = re.search(rf"<!-- snippet: {name} -->\n```python\n(.*?)\n```", text, re.S)
    assert match, f"README.md has no python block after <!-- snippet: {name} -->"
    return match.group(1)


def first_trainer_step(where: Path) -> None:
    """README's first trainer step, run as written on the quickstart's output (`where/tracefleet-output`): the
    quickstart door plus its install line (torch, from PyTorch's CPU index; this venv has it already)."""
    code = readme_snippet("first-trainer-step")
    assert re.match(r"# .*pip install torch --index-url https://download.pytorch.org/whl/cpu", code), code
    done = subprocess.run([sys.executable, "-c", code], cwd=where, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = re.findall(r"^batch (\d+): (\d+) trainable tokens, loss (\S+)$", done.stdout, re.M)
    assert [int(s) for s, _, _ in steps] == [0, 1, 2], done.stdout  # a batch per group of 6
    assert all(int(n) > 0 and math.isfinite(float(loss)) for _, n, loss in steps), done.stdout


def test_the_summary_counts_groups_whose_advantages_are_not_zero() -> None:
    from tracefleet.runner.learning_signal import learning_signal_line
    from tracefleet.runner.session import SessionResult

    def result(task: str, i: int, reward: float, status: str = "completed") -> SessionResult:
        return SessionResult(session_id=f"{task}-{i}", job="j", task_id=task, sample_index=i, group_id=f"j/{task}",
                             status=status, reward=reward, session_dir="/nowhere")

    results = [result("a", 0, 1.0), result("a", 1, 0.0), result("b", 0, 1.0), result("b", 1, 1.0),
               result("c", 0, 0.0), result("c", 1, 0.0, status="error")]
    assert learning_signal_line(results) == "rewards 0..1 (std 0.50); 1 of 3 groups (33%) have non-zero advantages"
    assert learning_signal_line([result("a", 0, 1.0, status="stopped")]) == "-"


def test_the_agent_reports_code_that_loops_forever_as_failed_tests(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The model's code is run by the agent's own test run: code that never returns is a failure the agent tells
    # the model about, never a crash of the harness (a crash cost CI one quickstart session, 2026-12-01).
    agent = script_module(REPO / "examples" / "quickstart" / "agent.py", "quickstart_agent")
    (tmp_path / "calc.py").write_text("def add(a, b):\n    while True:\n        pass\n")
    (tmp_path / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n")
    monkeypatch.setattr(agent, "TEST_TIMEOUT_S", 3.0)
    passed, output = agent.run_tests(tmp_path)
    assert not passed and output == "The tests ran past 3 seconds and were stopped: does the code loop forever?"
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    assert agent.run_tests(tmp_path)[0]
