#!/usr/bin/env python3
"""A tiny coding agent: the example harness for tracefleet's `command` preset.

It is an ordinary program that calls a model through the OpenAI Chat Completions API (standard
library only), so it shows what tracefleet needs from any harness: nothing but OPENAI_BASE_URL and
OPENAI_API_KEY. tracefleet points those at its proxy, which records every call at the token level.

Loop (at most AGENT_MAX_TURNS turns): show the model the task and the source files, ask for the
whole corrected file in one fenced code block, write it, run the tests, and send the failures back.

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=... python agent.py "Fix add() in calc.py"
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

MAX_TURNS = int(os.environ.get("AGENT_MAX_TURNS", "2"))
MAX_TOKENS = int(os.environ.get("AGENT_MAX_TOKENS", "96"))
TEMPERATURE = float(os.environ.get("AGENT_TEMPERATURE", "1.0"))
# Stop strings (a JSON list), e.g. ["```\n\n"]: the answer ends where the code block does, instead of running on
# in prose to the token cap (a rewarded answer cut at the cap is what the failure_rewarded diagnostic flags).
STOP = json.loads(os.environ.get("AGENT_STOP", "null"))
REQUEST_TIMEOUT_S = float(os.environ.get("AGENT_REQUEST_TIMEOUT_S", "300"))
# The model's code can loop forever: past this, the agent's own test run is a failure it reports to the model
# (the evaluator, with its own limit, decides the reward).
TEST_TIMEOUT_S = float(os.environ.get("AGENT_TEST_TIMEOUT_S", "30"))
FENCE = re.compile(r"```[a-zA-Z]*\n(.*?)(?:```|\Z)", re.DOTALL)

SYSTEM = (
    "You fix bugs in small Python files. Answer with the complete corrected file in one "
    "```python code block and nothing else."
)


def base_url() -> str:
    url = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1").rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def chat(messages: list[dict[str, str]]) -> tuple[str, str | None]:
    """The model's reply and why it ended (`length`: cut at MAX_TOKENS)."""
    body = {
        "model": os.environ.get("OPENAI_MODEL", "default"),
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": TEMPERATURE,
        **({"stop": STOP} if STOP else {}),
    }
    request = urllib.request.Request(
        base_url() + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', '')}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"agent: model call failed: HTTP {exc.code}: {exc.read()[:500]!r}") from exc
    choice = answer["choices"][0]
    return choice["message"].get("content") or "", choice.get("finish_reason")


def source_files(workdir: Path) -> list[Path]:
    return sorted(p for p in workdir.glob("*.py") if not p.name.startswith("test_"))


def run_tests(workdir: Path) -> tuple[bool, str]:
    """Whether the tests passed, and the tail of what they printed."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "--no-header", "-p", "no:cacheprovider"],
            cwd=workdir, capture_output=True, text=True, timeout=TEST_TIMEOUT_S, check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"The tests ran past {TEST_TIMEOUT_S:g} seconds and were stopped: does the code loop forever?"
    return done.returncode == 0, (done.stdout + done.stderr)[-1500:]


def main() -> int:
    workdir = Path.cwd()
    # TRACEFLEET_PROMPT is left out for a prompt over 128 KiB; TRACEFLEET_PROMPT_FILE always holds it
    prompt_file = os.environ.get("TRACEFLEET_PROMPT_FILE")
    prompt = (" ".join(sys.argv[1:]) or os.environ.get("TRACEFLEET_PROMPT", "")
              or (Path(prompt_file).read_text() if prompt_file else sys.stdin.read()))
    files = source_files(workdir)
    if not files:
        print("agent: no source files to fix", file=sys.stderr)
        return 2
    target = files[0]
    shown = "\n\n".join(f"# file: {p.name}\n```python\n{p.read_text()}```" for p in files)
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{prompt}\n\n{shown}\n\nWrite the corrected {target.name}."},
    ]
    for turn in range(1, MAX_TURNS + 1):
        reply, finish = chat(messages)
        messages.append({"role": "assistant", "content": reply})
        print(json.dumps({"turn": turn, "reply": reply, "finish_reason": finish}), flush=True)
        match = FENCE.search(reply)
        if finish == "length" and not (match and match.group(0).endswith("```")):
            # the token cap cut the code block itself (or came before it): a file cut off is not the model's
            # finished answer, so it is never written and no reward rests on it. A block closed before the cap
            # (the cut fell in prose after it) is a whole file.
            messages.append({"role": "user", "content": f"Your answer was cut off. Reply with the whole {target.name} "
                                                        "in a shorter ```python block."})
            continue
        if not match or not match.group(1).strip():
            messages.append({"role": "user", "content": f"Reply with the whole {target.name} in a ```python block."})
            continue
        target.write_text(match.group(1).rstrip() + "\n")
        passed, output = run_tests(workdir)
        print(json.dumps({"turn": turn, "tests_passed": passed}), flush=True)
        if passed:
            return 0
        messages.append({"role": "user", "content": f"The tests still fail:\n{output}\nFix {target.name} again."})
    return 0  # the evaluator, not the agent, decides the reward


if __name__ == "__main__":
    raise SystemExit(main())
