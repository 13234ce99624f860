"""Every `TRACEFLEET_*` environment variable outside a pod's own configuration (that is
tracefleet.contract.podenv), by who sets it and who reads it: one name, defined once.
"""

from __future__ import annotations

import os
from pathlib import Path

# ---- this machine's settings (a person or an image sets them; every program reads them)
CACHE = "TRACEFLEET_CACHE"  # binaries, models, harness CLIs (hack/setup.sh); default ~/.cache/tracefleet
SPOOL = "TRACEFLEET_SPOOL"  # where sealed data waits for its upload (tracefleet.bucket.spool_dir)
S3_ENDPOINT = "TRACEFLEET_S3_ENDPOINT"  # the S3 endpoint, before AWS_ENDPOINT_URL
DEBUG = "TRACEFLEET_DEBUG"  # set: an unexpected CLI error shows its traceback instead of one line
ADMIN_TOKEN = "TRACEFLEET_ADMIN_TOKEN"  # `tracefleet proxy --admin-token`'s default
PROXY_IMAGE = "TRACEFLEET_PROXY_IMAGE"  # `tracefleet operator --proxy-image`'s default
EVALUATOR_IMAGE = "TRACEFLEET_EVALUATOR_IMAGE"  # `tracefleet operator --evaluator-image`'s default
GIT_HOME = "TRACEFLEET_GIT_HOME"  # HOME for the git commands that prepare a workspace (default: none)


def harness_bin(preset: str) -> str:
    """`TRACEFLEET_<PRESET>_BIN` (e.g. TRACEFLEET_CLAUDE_CODE_BIN): a harness CLI outside the cache."""
    return f"TRACEFLEET_{preset.upper().replace('-', '_')}_BIN"


def cache_dir() -> Path:
    """$TRACEFLEET_CACHE, else ~/.cache/tracefleet."""
    return Path(os.environ.get(CACHE) or Path.home() / ".cache" / "tracefleet")


# ---- what a `command` harness process reads (runner/presets/command.py sets them)
HARNESS_BASE_URL = "TRACEFLEET_BASE_URL"  # the proxy, with the session's path
HARNESS_API_KEY = "TRACEFLEET_API_KEY"  # the session secret (also what Codex, Pi and OpenCode configs name)
HARNESS_MODEL = "TRACEFLEET_MODEL"
HARNESS_PROMPT = "TRACEFLEET_PROMPT"  # unset when the prompt is over one environment entry's limit
HARNESS_PROMPT_FILE = "TRACEFLEET_PROMPT_FILE"  # the prompt, always, as a file
HARNESS_WORKDIR = "TRACEFLEET_WORKDIR"

# ---- what an evaluator's command or hook reads (runner/evaluators sets them)
EVAL_TASK_ID = "TRACEFLEET_TASK_ID"
EVAL_PATCH_FILE = "TRACEFLEET_PATCH_FILE"
EVAL_ORIGINAL = "TRACEFLEET_ORIGINAL"
EVAL_DIR = "TRACEFLEET_EVAL_DIR"
EVAL_HARNESS_EXIT_CODE = "TRACEFLEET_HARNESS_EXIT_CODE"
EVAL_HARNESS_STDOUT = "TRACEFLEET_HARNESS_STDOUT"
HOOK_RESULT_MARK = "TRACEFLEET_HOOK_RESULT "  # the line prefix an evaluator hook's result is printed after

# ---- what a diagnostic hook or command reads
DIAGNOSTIC_PARAMS = "TRACEFLEET_DIAGNOSTIC_PARAMS"

# A judge's Python (evaluators, the Harbor verifier, locally and in an evaluator Job) must not import from the working
# directory or the user site the agent could write, nor leave bytecode there.
HARDENED_PYTHON_ENV = {"PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
