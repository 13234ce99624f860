"""`tracefleet engine --backend vllm --model gemma3-270m`, as a user runs it: real vLLM (CPU build) serving the
Gemma 3 270M that setup converted once (hack/setup.d/45-vllm.sh), with vLLM arguments passed after `--`.

What must hold: it serves Gemma with the context and output cap given after `--`; both of Gemma's end-of-turn
tokens (`<end_of_turn>`, `<eos>`) end a generation; a real harness whose first prompt is far beyond SmolLM2's
context (Qwen Code, ~18.6k tokens) completes a session through `tracefleet run --engine-url` in exact mode; and
SIGTERM stops it within its grace with every vLLM process gone (the last test: it ends the module's server).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fixtures.engines import EngineProcess
from fixtures.harnesses import harness_binary_path
from fixtures.local_runs import run_local
from tracefleet.contract.capture import read_capture_log
from tracefleet.engine.vllm_local import STARTUP_TIMEOUT_S, STOP_GRACE_S
from tracefleet.process_group import running_members

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 24_576  # given after `--`: vLLM's own flag, overriding the trained 32,768
# vLLM's per-call output cap (a generation-config override, also after `--`): the harness's answers stay short,
# so a session costs one long prefill and a few seconds of decoding on 2 cores.
OUTPUT_CAP = 24
# Prefill in chunks of 2048 tokens: a 10k-token prompt prefilled in one step took the worker past 4 GB and the
# shared machine's OOM killer took it (measured); chunks bound its activations.
PREFILL_CHUNK = 2048
VLLM_ARGS = ["--max-model-len", str(MAX_MODEL_LEN),
             "--override-generation-config", json.dumps({"max_new_tokens": OUTPUT_CAP}),
             "--max-num-batched-tokens", str(PREFILL_CHUNK)]
END_OF_TURN, EOS = 106, 1  # Gemma 3's <end_of_turn> and <eos>
HARNESS = "qwen-code"  # first prompt ~18.6k tokens with Gemma (docs/your-job.md, "Real harnesses")
LONG_PROMPT = 12_000
# vLLM's API server exits by itself 1.0-2.4 s after SIGTERM here (2026-12-01, 3 runs), once 9.2 s in CI (its
# shutdown logged within the second, then the interpreter's exit took the rest). `tracefleet engine` waits
# STOP_GRACE_S for that and kills what still runs after it: what the test holds it to, with a second for the polls.
STOP_LIMIT_S = STOP_GRACE_S + 1.0


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, their children, ...) that still runs, read from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@pytest.fixture(scope="module")
def gemma_vllm() -> Iterator[EngineProcess]:
    # vLLM sizes its own CPU threads: the fixtures' one-OpenMP-thread default would halve its speed
    engine = EngineProcess(["--backend", "vllm", "--model", "gemma3-270m", "--", *VLLM_ARGS],
                           startup_timeout_s=STARTUP_TIMEOUT_S, env={"OMP_NUM_THREADS": str(os.cpu_count() or 1)})
    yield engine
    engine.stop()


def test_serves_gemma_with_the_arguments_after_the_double_dash(gemma_vllm: EngineProcess) -> None:
    card = httpx.get(gemma_vllm.url + "/v1/models", timeout=10).raise_for_status().json()["data"][0]
    assert card["id"] == "gemma3-270m" and card["max_model_len"] == MAX_MODEL_LEN, card
    listening = gemma_vllm.event("listening")
    assert listening["backend"] == "vllm" and listening["max_model_len"] == MAX_MODEL_LEN, listening
    r = httpx.post(gemma_vllm.url + "/v1/completions", timeout=120, json={
        "model": "gemma3-270m", "prompt": "<start_of_turn>user\nSay hello.<end_of_turn>\n<start_of_turn>model\n",
        "max_tokens": 1000, "temperature": 0, "return_token_ids": True})
    choice = r.raise_for_status().json()["choices"][0]
    assert len(choice["token_ids"]) <= OUTPUT_CAP, choice  # the override after `--` caps every call


@pytest.mark.parametrize("stop_id", [END_OF_TURN, EOS])
def test_both_gemma_end_of_turn_tokens_end_a_generation(gemma_vllm: EngineProcess, stop_id: int) -> None:
    # logit_bias makes the model sample the token first: a stop token ends the call there ("stop", one token);
    # any other token would run on to max_tokens ("length"), as the control below shows
    def forced(token_id: int) -> dict:
        r = httpx.post(gemma_vllm.url + "/v1/completions", timeout=120, json={
            "model": "gemma3-270m", "prompt": [2, 105, 2364, 107], "max_tokens": 4, "temperature": 0,
            "logit_bias": {str(token_id): 100}, "return_token_ids": True})
        return r.raise_for_status().json()["choices"][0]

    stopped = forced(stop_id)
    assert (stopped["finish_reason"], stopped["token_ids"]) == ("stop", [stop_id]), stopped
    control = forced(107)  # "\n"
    assert (control["finish_reason"], control["token_ids"]) == ("length", [107] * 4), control


def test_a_real_harness_with_a_long_first_prompt_completes_in_exact_mode(gemma_vllm: EngineProcess,
                                                                          tmp_path: Path) -> None:
    harness_binary_path(HARNESS)  # fails with the install command when setup has not installed it
    job = {
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "gemma-long-prompt"},
        "spec": {
            "inference": {"external": {"baseUrl": gemma_vllm.url}, "capture": {"mode": "exact"}},
            # Qwen Code's own output limit, as small as vLLM's cap: without one it answers a cut-off reply by
            # asking again with 64k and then "resume" three times (10 calls, 400 s measured); with it, one call
            "harness": {"preset": HARNESS, "sessionTimeoutSeconds": 540,
                        "env": {"QWEN_CODE_MAX_OUTPUT_TOKENS": str(OUTPUT_CAP)}},
            "tasks": {"samplesPerTask": 1, "inline": [
                {"id": "hello", "prompt": "Create the file hello.txt containing the word hello."}]},
            "evaluator": {"preset": "command", "command": ["true"], "timeoutSeconds": 60},
            "output": {"uri": str(tmp_path / "out"), "tracesPerBatch": 1},
            "parallelism": 1,
        },
    }
    done, seconds = run_local(job, tmp_path, engine_url=gemma_vllm.url, timeout_s=600)
    output = done.stdout + done.stderr
    print(f"\n{HARNESS} on vLLM Gemma: exit {done.returncode} in {seconds:.0f} s\n{output[-3000:]}")
    assert done.returncode == 0, output
    assert "capture mode exact" in done.stderr and "status         completed 1" in done.stdout, output
    records = [r for log in sorted((tmp_path / "work" / "capture").rglob("*.jsonl"))
               for r in read_capture_log(log).records]
    assert records and all(r.status == "ok" for r in records), [(r.status, r.error) for r in records]
    assert max(len(r.prompt_ids) for r in records) >= LONG_PROMPT, [len(r.prompt_ids) for r in records]
    assert all(r.completion_ids and len(r.logprobs) == len(r.completion_ids) for r in records)
    print(f"prompt tokens {[len(r.prompt_ids) for r in records]}, sampled {[len(r.completion_ids) for r in records]}")


def test_sigterm_stops_it_within_seconds_and_every_vllm_process_is_gone(gemma_vllm: EngineProcess) -> None:
    proc = gemma_vllm.process
    tree = descendants(proc.pid)
    assert tree, "tracefleet engine has no vLLM processes below it"
    started = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    gone: dict[int, float] = {}  # when each vLLM process stopped running (for the message when it is slow)
    while proc.poll() is None and time.monotonic() - started < 60:
        alive = _running(tree)
        gone.update({pid: round(time.monotonic() - started, 2) for pid in tree - alive if pid not in gone})
        time.sleep(0.05)
    code = proc.wait(timeout=1)
    took = time.monotonic() - started
    time.sleep(0.2)  # the engine core's own exit, if it were still on its way
    left = sorted(_running(tree))
    print(f"\nSIGTERM -> exit {code} in {took:.2f} s; vLLM processes before: {sorted(tree)}, "
          f"stopped running at (s): {gone}, left: {left}")
    assert code == 0 and took < STOP_LIMIT_S, (code, took, gone, gemma_vllm.output)
    assert left == [], left
    stopped = gemma_vllm.event("stopped")
    assert stopped["seconds"] < STOP_LIMIT_S, stopped
    # vLLM was told to stop (its own shutdown ran), not only killed
    vllm_log = Path(gemma_vllm.event("listening")["log"]).read_text(errors="replace")
    assert "[shutdown] API server: shutdown triggered" in vllm_log
    assert running_members(proc.pid) == []


def _running(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            alive.add(pid)
    return alive
