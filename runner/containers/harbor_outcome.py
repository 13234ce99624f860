"""A Harbor verifier's verdict as the runner's evaluator outcome, and the verdict read from what the verifier left:
one reading for every place that runs Harbor's verifier contract (the local `harbor` evaluator through podman, the
evaluator Job's report step on a cluster), so the same test.sh outcome gives the same row in both drivers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    """The runner's outcome, as the local `harbor` evaluator makes it (runner.evaluators.harbor.outcome_of_verdict
    on the local side's branch: one of the two goes when both are merged): the training reward; fail-closed
    statuses as `timeout` or `error`, reward 0, the verdict's reason as the message; every metric test.sh wrote
    (EvalOutcome.metrics where the contract has it), kept also when fail-closed."""
    details = {"verdict": verdict.status, "reward_file": verdict.reward_file, "exit_code": verdict.exit_code,
               "output_tail": verdict.output_tail[-2000:]}
    metrics: dict[str, Any] = {"metrics": verdict.metrics} if "metrics" in EvalOutcome.model_fields else {}
    if verdict.status == "ok":
        return EvalOutcome(reward=verdict.reward, details=details, duration_s=verdict.duration_s, **metrics)
    return EvalOutcome(status="timeout" if verdict.status == "timeout" else "error", reward=0.0,
                       message=f"harbor verifier: {verdict.reason}", details=details, duration_s=verdict.duration_s,
                       **metrics)
