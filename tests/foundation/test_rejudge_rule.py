"""Which sealed sessions a rerun judges again (tracefleet.contract.rejudge.rejudges): what the judge could not judge,
and a timed-out judging only under a changed evaluator; never the policy's own outcome."""

from __future__ import annotations

import pytest

from tracefleet.contract.rejudge import EVALUATOR_CHANGED, NEVER_JUDGED, UNAVAILABLE, rejudges

TIMED_OUT = {"status": "timeout", "details": {"evaluator_spec": "aaaa"}}


@pytest.mark.parametrize("reasons, evaluation, now, why", [
    (["evaluator_unavailable"], {"status": "unavailable"}, "aaaa", UNAVAILABLE),
    (["evaluator_missing"], None, "aaaa", NEVER_JUDGED),
    (["session_timeout:harness", "evaluator_missing"], None, "aaaa", None),  # never reached its judge: the policy's
    (["evaluator_timeout"], TIMED_OUT, "aaaa", None),  # the same evaluator: the agent's code ran out its time
    (["evaluator_timeout"], TIMED_OUT, "bbbb", EVALUATOR_CHANGED),
    (["evaluator_timeout"], {"status": "timeout"}, "bbbb", None),  # sealed before verdicts named their evaluator
    (["evaluator_error"], {"status": "error"}, "bbbb", None),
    ([], {"status": "ok"}, "bbbb", None),
])
def test_what_a_rerun_judges_again(reasons: list[str], evaluation: dict | None, now: str, why: str | None) -> None:
    assert rejudges(reasons, evaluation, now) == why
