"""A Harbor verifier's verdict as the runner's evaluator outcome, and the verdict read from what the verifier left:
one reading for every place that runs Harbor's verifier contract (the local `harbor` evaluator through podman, the
evaluator Job's report step on a cluster), so the same test.sh outcome gives the same row in both drivers."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tracefleet.contract.harbor import (CONTAINER_VERIFIER_LOGS, REWARD_JSON, REWARD_TXT, TRAINING_REWARD_KEY,
                                         HarborVerdict)
from tracefleet.contract import task_image as ti
from tracefleet.contract.session import EvalOutcome, EvalStatus
from tracefleet.runner.containers.runtime import last_line

OUTPUT_TAIL = 4000


def _metrics(data: object) -> dict[str, float] | None:
    if not isinstance(data, dict) or not data:
        return None
    out: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        out[str(key)] = float(value)
    return out


def read_reward(logs: Path) -> tuple[str, float, dict[str, float], str | None, str | None]:
    """(status, reward, metrics, reward file, reason) from the verifier's log folder on the host."""
    json_path, txt_path = logs / REWARD_JSON, logs / REWARD_TXT
    if json_path.is_file() and not json_path.is_symlink():
        text = json_path.read_text(errors="replace")
        try:
            metrics = _metrics(json.loads(text))
        except ValueError:
            metrics = None
        if metrics is None:
            return "unreadable_reward", 0.0, {}, REWARD_JSON, \
                f"{REWARD_JSON} is not a JSON object of finite numbers: {text.strip()[:120]!r}"
        if TRAINING_REWARD_KEY not in metrics:
            return "no_reward", 0.0, metrics, REWARD_JSON, \
                f"{REWARD_JSON} has no {TRAINING_REWARD_KEY!r} metric (it has {', '.join(sorted(metrics))})"
        return "ok", metrics[TRAINING_REWARD_KEY], metrics, REWARD_JSON, None
    if txt_path.is_file() and not txt_path.is_symlink():
        text = txt_path.read_text(errors="replace").strip()
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            return "unreadable_reward", 0.0, {}, REWARD_TXT, f"{REWARD_TXT} does not hold one number: {text[:120]!r}"
        return "ok", value, {TRAINING_REWARD_KEY: value}, REWARD_TXT, None
    return "no_reward", 0.0, {}, None, f"test.sh wrote neither {CONTAINER_VERIFIER_LOGS}/{REWARD_TXT} nor {REWARD_JSON}"


def harbor_verdict(logs: Path, *, exit_code: int | None, output: str, timed_out: bool, timeout_s: float,
                   duration_s: float, error: str | None = None) -> HarborVerdict:
    """The verdict on one run of test.sh: `logs` is the fresh folder mounted at /logs/verifier (read on this side,
    never through the task container), `exit_code` test.sh's status (None: it never ran, `error` says why)."""
    tail = output[-OUTPUT_TAIL:]
    if timed_out:
        return HarborVerdict(status="timeout", reward=0.0, duration_s=duration_s, exit_code=exit_code,
                             reason=f"test.sh ran past [verifier].timeout_sec ({timeout_s:g} s)", output_tail=tail)
    if exit_code is None:
        return HarborVerdict(status="error", reward=0.0, duration_s=duration_s, output_tail=tail,
                             reason=error or f"test.sh did not run: {last_line(output)}")
    status, reward, metrics, reward_file, reason = read_reward(logs)
    if status == "no_reward" and not metrics:
        reason = f"{reason} (exit status {exit_code}: {last_line(output)})"
    return HarborVerdict(status=status, reward=reward, metrics=metrics, reward_file=reward_file, reason=reason,
                         exit_code=exit_code, duration_s=duration_s, output_tail=tail)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def verdict_here(eval_dir: Path, logs: Path, timeout_s: float) -> HarborVerdict:
    """The outcome of tracefleet.harbor.task_image_programs.VERIFIER, read from its eval folder and the verifier logs' folder
    (the evaluator Job's volumes on a cluster, the local verifier's temporary folders)."""
    code_text = _read(eval_dir / ti.EXIT_CODE).strip()
    duration = _read(eval_dir / ti.DURATION).strip()
    fetch_error = _read(eval_dir / ti.FETCH_ERROR).strip()
    output = _read(eval_dir / ti.TEST_OUTPUT)
    return harbor_verdict(logs, exit_code=int(code_text) if code_text.lstrip("-").isdigit() else None,
                          output=output, timed_out=(eval_dir / ti.TIMED_OUT).exists(),
                          timeout_s=timeout_s, duration_s=float(duration) if duration.isdigit() else 0.0,
                          error=fetch_error or (None if output.strip() else
                                                "the task image's verify step left no exit status (did it run?)"))


def eval_outcome_of_verdict(verdict: HarborVerdict) -> EvalOutcome:
    """The runner's outcome (the local `harbor` evaluator's and the evaluator Job's): the training reward;
    fail-closed statuses as `timeout`, `error` or `unavailable` (outcome_status), reward 0, the verdict's reason as the message; every metric
    test.sh wrote, kept also when fail-closed."""
    details = {"verdict": verdict.status, "reward_file": verdict.reward_file, "exit_code": verdict.exit_code,
               "output_tail": verdict.output_tail[-2000:]}
    if verdict.status == "ok":
        return EvalOutcome(reward=verdict.reward, metrics=verdict.metrics, details=details,
                           duration_s=verdict.duration_s)
    return EvalOutcome(status=outcome_status(verdict), reward=0.0, message=f"harbor verifier: {verdict.reason}",
                       metrics=verdict.metrics, details=details, duration_s=verdict.duration_s)


def outcome_status(verdict: HarborVerdict) -> EvalStatus:
    """A fail-closed verdict's status: test.sh that never ran (its container did not start, its inputs could not be
    fetched) is `unavailable`, the infrastructure's; one that ran and wrote no reward ran in the agent's environment,
    so it stays the policy's `error` (tracefleet.contract.semantics)."""
    if verdict.status == "timeout":
        return "timeout"
    return "unavailable" if verdict.status == "error" and verdict.exit_code is None else "error"
