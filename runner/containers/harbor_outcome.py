"""A Harbor verifier's verdict as the runner's evaluator outcome, and the verdict read from what the verifier left:
one reading for every place that runs Harbor's verifier contract (the local `harbor` evaluator through podman, the
evaluator Job's report step on a cluster), so the same test.sh outcome gives the same row in both drivers."""

from __future__ import annotations

from pathlib import Path

from tracefleet.contract.harbor import HarborVerdict
from tracefleet.contract.session import EvalOutcome
from tracefleet.runner.containers.runtime import last_line
from tracefleet.runner.containers.verifier import OUTPUT_TAIL, read_reward


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


def outcome_of(verdict: HarborVerdict) -> EvalOutcome:
    """The runner's outcome: the training reward, fail-closed statuses as `timeout` or `error` with the reason, and
    every metric test.sh wrote in `details.metrics` (kept in the batch even when fail-closed)."""
    status = "ok" if verdict.status == "ok" else "timeout" if verdict.status == "timeout" else "error"
    return EvalOutcome(reward=verdict.reward if status == "ok" else 0.0, status=status, message=verdict.reason,
                       duration_s=verdict.duration_s,
                       details={"harbor_status": verdict.status, "metrics": verdict.metrics,
                                "reward_file": verdict.reward_file, "exit_code": verdict.exit_code,
                                "output_tail": verdict.output_tail})
