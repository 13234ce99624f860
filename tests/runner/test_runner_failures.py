"""A run that fails says so: when every model call of its sessions failed (or nothing trainable was sealed),
`tracefleet run` exits non-zero and prints one line per kind of failure, read from the capture records'
errors and the sessions' results, instead of `status completed … batches 0 new: none` and exit 0."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from fixtures.harnesses import harness_binary_path
from tracefleet.runner.failures import MESSAGE_CHARS, harness_reason, run_verdict
from tracefleet.runner.sandbox import ProcessResult
from tracefleet.runner.session import SessionResult, StageFailed, wait_stage

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"

# The one model call both harnesses below make, through the session's OpenAI-Chat endpoint.
MODEL_REQUEST = textwrap.dedent(
    """
    import json, os, sys, urllib.error, urllib.request
    req = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": os.environ["OPENAI_MODEL"], "max_tokens": 8,
                         "messages": [{"role": "user", "content": os.environ["TRACEFLEET_PROMPT"]}]}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    """
)

# A harness that, like a real CLI whose model calls all fail, reports the error and still exits 0.
SHRUGGING_HARNESS = MODEL_REQUEST + textwrap.dedent(
    """
    try:
        urllib.request.urlopen(req, timeout=60)
    except urllib.error.HTTPError as exc:
        print("model call failed:", exc.code, file=sys.stderr)
    """
)


def _job(tmp_path: Path, engine_url: str) -> Path:
    (tmp_path / "harness.py").write_text(SHRUGGING_HARNESS)
    job = {
        "apiVersion": "tracefleet.io/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": "all-calls-fail"},
        "spec": {
            "inference": {"external": {"baseUrl": engine_url}, "capture": {"mode": "server"}},
            "harness": {"preset": "command", "command": ["python", "{job_dir}/harness.py"], "sessionTimeoutSeconds": 120},
            "tasks": {"samplesPerTask": 2, "inline": [
                {"id": f"t{i}", "prompt": f"fix task {i} so that its tests pass",
                 "workspace": {"repo": str(QUICKSTART / "tasks" / "calc")}} for i in range(2)]},
            "evaluator": {"preset": "command", "command": ["true"]},
            "output": {"uri": str(tmp_path / "out"), "tracesPerBatch": 4},
            "parallelism": 2,
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_every_call_refused_fails_the_run_with_the_engines_reason(make_scripted_engine: Any, tmp_path: Path) -> None:
    # A context of 16 tokens: every prompt (the chat template's system turn alone is longer) is refused
    # with vLLM's 400, as the 4096-token CPU engine refused a harness's max_tokens 16384.
    engine = make_scripted_engine(extra_args=["--max-model-len", "16"])
    done = subprocess.run(
        [sys.executable, "-m", "tracefleet", "run", str(_job(tmp_path, engine.url)), "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "status         completed 4" in output, output  # the harness exited 0 every time...
    failed = [line.strip() for line in output.splitlines() if line.strip().startswith("FAILED: ")]
    # ...and the run still says what went wrong, one line per kind, with the engine's own words.
    assert failed[0] == "FAILED: 4 of 4 sessions had every model call fail", failed
    assert failed[1].startswith("FAILED: 4 of 4 calls rejected by the engine (HTTP 400): "), failed
    assert "maximum context length is 16 tokens" in failed[1], failed
    # (each session is sealed as a fail-closed row without tokens: nothing a trainer can learn from)
    assert failed[2] == "FAILED: nothing trainable sealed: 4 traces, 0 trainable tokens from 4 sessions and 4 model calls", failed
    assert len(failed) == 3 and "Traceback" not in output, failed


def _result(i: int, **kw: Any) -> SessionResult:
    return SessionResult(session_id=f"s{i}", job="j", task_id="t", sample_index=i, group_id="j/t", session_dir="/nowhere", **kw)


def test_verdict_groups_session_failures_by_stage() -> None:
    ok = [_result(0, calls=2), _result(1, calls=3)]
    assert run_verdict(ok, sealed_traces=2, trainable_tokens=40).failed is False
    broken = [_result(i, status="error", stage="harness", error=f"harness exited {1 + i % 2}", calls=0) for i in range(3)]
    broken.append(_result(3, status="timeout", stage="harness", error="harness ran past 300s; process group killed"))
    verdict = run_verdict(broken, sealed_traces=4, trainable_tokens=0)
    assert verdict.failed
    assert verdict.reasons == [
        "3 of 4 sessions failed at harness: harness exited 1",
        "1 of 4 sessions timed out at harness: harness ran past 300s; process group killed",
        "nothing trainable sealed: 4 traces, 0 trainable tokens from 4 sessions and 0 model calls"
        " (did the harness reach the proxy? see harness.stderr in the work dir)",
    ]
    # Some sessions failing is data (sealed, fail-closed), not a failed run.
    assert run_verdict(ok + broken[:1], sealed_traces=3, trainable_tokens=40).failed is False
    # An interrupted run is judged by the sessions that ran, not the stopped ones.
    assert run_verdict([_result(0, status="stopped", stage="harness")], sealed_traces=0, trainable_tokens=0).failed is False


# A harness that makes its model call and then gives up the way a CLI does: its reason on its own output
# (here a Codex-shaped JSON event on stdout and a plain line on stderr), exit 1.
QUITTING_HARNESS = MODEL_REQUEST + textwrap.dedent(
    """
    urllib.request.urlopen(req, timeout=60).read()
    print(json.dumps({"type": "thread.started"}))
    print(json.dumps({"type": "turn.failed", "error": {"message": "Incomplete response returned, reason: max_output_tokens"}}))
    print("warning: 1 turn left unfinished", file=sys.stderr)
    sys.exit(1)
    """
)


def test_a_harness_that_exits_non_zero_is_reported_with_its_own_reason(make_scripted_engine: Any, tmp_path: Path) -> None:
    engine = make_scripted_engine()
    job_path = _job(tmp_path, engine.url)
    (tmp_path / "harness.py").write_text(QUITTING_HARNESS)
    done = subprocess.run(
        [sys.executable, "-m", "tracefleet", "run", str(job_path), "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    reason = "harness exited 1: Incomplete response returned, reason: max_output_tokens"
    # the verdict is the run's result (stdout), with the harness's own words...
    failed = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("FAILED: ")]
    assert f"FAILED: 4 of 4 sessions failed at harness: {reason}" in failed, failed
    assert "status         completed 0, the policy's failures 4 (failed at harness 4)" in done.stdout, done.stdout
    assert "inspect: tracefleet traces ls" in done.stdout, done.stdout
    # ...and each failed session says it as it finishes, whose failure it is, with the progress (stderr)
    per_session = [line for line in done.stderr.splitlines() if ": failed at harness (the policy's): " in line]
    assert len(per_session) == 4 and all(line.endswith(reason) for line in per_session), done.stderr
    assert "FAILED" not in done.stderr and "status  " not in done.stderr, done.stderr


def _outputs(tmp_path: Path, stdout: str = "", stderr: str = "") -> Path:
    (tmp_path / "harness.stdout").write_text(stdout)
    (tmp_path / "harness.stderr").write_text(stderr)
    return tmp_path


@pytest.mark.parametrize(("stdout", "stderr", "reason"), [
    # Claude Code (stream-json): the result event carries the API error, marked is_error
    ('{"type":"system","subtype":"init"}\n{"type":"result","subtype":"success","is_error":true,"result":'
     '"API Error: Claude\'s response exceeded the 32000 output token maximum. To configure this behavior, set the '
     'CLAUDE_CODE_MAX_OUTPUT_TOKENS environment variable.","session_id":"x"}\n', "",
     "API Error: Claude's response exceeded the 32000 output token maximum. To configure this behavior, set the "
     "CLAUDE_CODE_MAX_OUTPUT_TOKENS environment variable."),
    # Codex (--json): a turn.failed event, its message nested under error
    ('{"type":"turn.started"}\n{"type":"turn.failed","error":{"message":"Incomplete response returned, reason: '
     'max_output_tokens"}}\n', "", "Incomplete response returned, reason: max_output_tokens"),
    # OpenCode: an error event whose words are under error.data.message
    ('{"type":"error","error":{"name":"APIError","data":{"message":"Bad Request: context too long"}}}\n', "",
     "Bad Request: context too long"),
    # Pi: the last message stopped with an error
    ('{"type":"message_end","message":{"stopReason":"error","errorMessage":"400 status code (no body)"}}\n'
     '{"type":"agent_end","stopReason":"error","errorMessage":"400 status code (no body)"}\n', "",
     "400 status code (no body)"),
    # plain text on stderr (Qwen Code, Gemini CLI, a Python traceback): the last error-looking line
    ("partial answer\n", "Loading...\n[API Error: 400 prompt is too long]\n  at foo (x.js:1:2)\n", "[API Error: 400 prompt is too long]"),
    ("", "Traceback (most recent call last):\n  File \"h.py\", line 3\nValueError: no workspace\n", "ValueError: no workspace"),
    # nothing error-looking: stderr's last line; nothing at all: no reason
    ("", "bye\n", "bye"),
    ("", "", None),
])
def test_harness_reason_is_its_last_error(tmp_path: Path, stdout: str, stderr: str, reason: str | None) -> None:
    assert harness_reason(_outputs(tmp_path, stdout, stderr)) == reason


def test_harness_reason_is_one_bounded_line(tmp_path: Path) -> None:
    reason = harness_reason(_outputs(tmp_path, stderr="Error: " + "x" * 5000 + "\nmore\n"))
    assert reason is not None and reason.startswith("Error: xxx") and len(reason) <= MESSAGE_CHARS and "\n" not in reason
    (tmp_path / "harness.stdout").unlink()
    (tmp_path / "harness.stderr").unlink()
    assert harness_reason(tmp_path) is None  # a harness that never started leaves no output files


def test_a_non_zero_exit_carries_the_harness_reason_in_every_driver(tmp_path: Path) -> None:
    # the session program (tracefleet.runner.session, the same on the host and in a pod) reads the reason from
    # the harness's outputs, so the session's error, its sealed rows and the FAILED line all carry it
    _outputs(tmp_path, stderr="fatal: model refused: quota exceeded\n")
    result = _result(0)
    with pytest.raises(StageFailed) as failed:
        wait_stage(ProcessResult(exit_code=1, timed_out=False, duration_s=1.0), None, result,  # type: ignore[arg-type]
                   stopped="", logs=tmp_path)
    assert str(failed.value) == "harness exited 1: fatal: model refused: quota exceeded"
    broken = [_result(i, status="error", stage="harness", error=str(failed.value)) for i in range(2)]
    verdict = run_verdict(broken, sealed_traces=2, trainable_tokens=0)
    assert verdict.reasons[0] == "2 of 2 sessions failed at harness: harness exited 1: fatal: model refused: quota exceeded"


@pytest.mark.slow
def test_a_real_harness_that_gives_up_is_reported_with_its_own_words(make_scripted_engine: Any, tmp_path: Path) -> None:
    # Claude Code against an engine whose 16-token context refuses every prompt: it reports the API error in its
    # stream-json result and exits 1; the run's verdict repeats that, not just "harness exited 1"
    harness_binary_path("claude-code")
    engine = make_scripted_engine(extra_args=["--max-model-len", "16"])
    job = yaml.safe_load(_job(tmp_path, engine.url).read_text())
    job["spec"]["harness"] = {"preset": "claude-code", "sessionTimeoutSeconds": 180}
    job["spec"]["tasks"]["samplesPerTask"] = 1
    job["spec"]["tasks"]["inline"] = job["spec"]["tasks"]["inline"][:1]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    done = subprocess.run(
        [sys.executable, "-m", "tracefleet", "run", str(tmp_path / "job.yaml"), "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=400, cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    failed = [line.strip() for line in done.stdout.splitlines() if "sessions failed at harness: harness exited" in line]
    print("\n" + "\n".join(failed))
    assert len(failed) == 1 and "maximum context length is 16 tokens" in failed[0], output
