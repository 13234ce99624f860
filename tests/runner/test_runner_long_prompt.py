"""A prompt of the schema's most characters reaches the harness and the model, with `tracefleet run` as a user runs it.

262,144 characters of four UTF-8 bytes each (1 MiB): eight times what Linux lets one argument or environment entry
hold (MAX_ARG_STRLEN, 128 KiB), so neither `-p <prompt>` nor TRACEFLEET_PROMPT can carry it. A `command` program
reads it from TRACEFLEET_PROMPT_FILE; a real CLI (Qwen Code) reads it on its standard input. The proxy's capture
holds the prompt as the model received it. The same job on the real node: tests/operator/test_node_maxima.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from fixtures.harnesses import harness_binary_path
from tracefleet.contract import environment
from tracefleet.contract.capture import CaptureRecord, read_capture_log

LONGEST = "\U0001F600" * 262144  # the schema's most characters (tracefleet.contract.job.InlineTask.prompt)
HARNESS = f"""
import json, os, urllib.request
assert "{environment.HARNESS_PROMPT}" not in os.environ  # one environment entry cannot hold it
prompt = open(os.environ["{environment.HARNESS_PROMPT_FILE}"]).read()
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({{"model": os.environ["OPENAI_MODEL"], "max_tokens": 8,
                      "messages": [{{"role": "user", "content": prompt}}]}}).encode(),
    headers={{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}})
json.load(urllib.request.urlopen(req, timeout=120))
"""
# the engine's context holds the prompt's tokens (the scripted engine tokenizes it with SmolLM2's tokenizer)
ENGINE_ARGS = ["--max-model-len", str(4 * 1024 * 1024)]


def user_text(record: CaptureRecord) -> str:
    """The last user message's text as the proxy recorded the call (its canonical conversation): a CLI puts its own
    context (the workspace, the date) in a user message before the task's."""
    messages = (record.canonical or {}).get("messages") or []
    parts = [m for m in messages if m.get("role") == "user"][-1]["parts"]
    return "".join(p.get("text", "") for p in parts)


def run_job(tmp_path: Path, engine_url: str, harness: dict[str, Any]) -> CaptureRecord:
    job = {
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "longest"},
        "spec": {
            "inference": {"external": {"baseUrl": engine_url}, "capture": {"mode": "server"}},
            "harness": {**harness, "sessionTimeoutSeconds": 180},
            "tasks": {"inline": [{"id": "t", "prompt": LONGEST}], "samplesPerTask": 1},
            "evaluator": {"preset": "command", "timeoutSeconds": 60, "command": ["true"]},
            "output": {"uri": str(tmp_path / "out"), "tracesPerBatch": 1},
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    r = subprocess.run([sys.executable, "-m", "tracefleet.cli", "run", str(tmp_path / "job.yaml"), "--work-dir",
                        str(tmp_path / "work")], capture_output=True, text=True, timeout=400, cwd=tmp_path,
                       env={**os.environ, environment.SPOOL: str(tmp_path / "spool")})
    (result,) = (tmp_path / "work" / "sessions").glob("*/longest-s0/**/result.json")
    assert r.returncode == 0 and '"completed"' in result.read_text(), (r.stdout[-2000:], r.stderr[-2000:],
                                                                       result.read_text()[-2000:])
    (capture,) = (tmp_path / "work" / "capture").glob("*/longest-s0.jsonl")
    (first, *_) = read_capture_log(capture).records
    return first


def test_a_command_harness_reads_the_longest_prompt_from_its_file(make_scripted_engine, tmp_path: Path) -> None:
    engine = make_scripted_engine(extra_args=ENGINE_ARGS)
    (tmp_path / "harness.py").write_text(HARNESS)
    record = run_job(tmp_path, engine.url, {"preset": "command", "command": ["python", "{job_dir}/harness.py"]})
    assert record.status == "ok" and user_text(record) == LONGEST


def test_a_real_cli_reads_the_longest_prompt_on_its_standard_input(make_scripted_engine, tmp_path: Path) -> None:
    """Qwen Code joins its standard input and `-p` as `<stdin>\\n\\n<-p>`: the prompt, then two newlines."""
    harness_binary_path("qwen-code")
    engine = make_scripted_engine({"tool_rounds": 0}, extra_args=ENGINE_ARGS)
    record = run_job(tmp_path, engine.url, {"preset": "qwen-code"})
    assert record.status == "ok" and user_text(record) == LONGEST + "\n\n", user_text(record)[-40:]
