#!/usr/bin/env python3
"""The smallest agent for the `command` preset (examples/local-command.yaml): one OpenAI Chat call, its answer
written to a file. Standard library only; tracefleet gives it the proxy as OPENAI_BASE_URL / OPENAI_API_KEY /
OPENAI_MODEL.

    python local_agent.py --prompt "Write a greeting." --out answer.txt
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.request
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--out", type=Path, required=True, help="where the model's answer is written")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    body = {"model": os.environ.get("OPENAI_MODEL", "default"), "max_tokens": args.max_tokens,
            "messages": [{"role": "user", "content": args.prompt}]}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', '')}"})
    with urllib.request.urlopen(request, timeout=300) as response:
        answer = json.load(response)["choices"][0]["message"].get("content") or ""
    args.out.write_text(answer + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
