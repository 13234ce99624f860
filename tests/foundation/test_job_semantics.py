"""What a RolloutJob means (tracefleet.contract.semantics): the pure rules both drivers call."""

from __future__ import annotations

import pytest

from tracefleet.contract import semantics as sem


def test_session_slots_number_sessions_by_task_then_sample_and_names_groups() -> None:
    slots = sem.session_slots("j", ["a", "b"], 3)
    assert [(p.index, p.task_index, p.task_id, p.sample_index, p.group_id) for p in slots] == [
        (0, 0, "a", 0, "j/a"), (1, 0, "a", 1, "j/a"), (2, 0, "a", 2, "j/a"),
        (3, 1, "b", 0, "j/b"), (4, 1, "b", 1, "j/b"), (5, 1, "b", 2, "j/b"),
    ]
    assert all(sem.task_and_sample(p.index, 3) == (p.task_index, p.sample_index) for p in slots)


def test_retry_only_failures_before_the_first_model_call() -> None:
    assert sem.should_retry(model_calls=0, retries_done=0, max_retries=2)
    assert sem.should_retry(model_calls=0, retries_done=1, max_retries=2)
    assert not sem.should_retry(model_calls=0, retries_done=2, max_retries=2)
    assert not sem.should_retry(model_calls=1, retries_done=0, max_retries=2)  # the policy's failure is data
    assert not sem.should_retry(model_calls=0, retries_done=0, max_retries=0)


def test_a_rerun_runs_again_only_what_failed_before_its_first_model_call() -> None:
    before_a_call = [sem.session_failure_reason("error", "harness")]
    assert sem.runs_again(before_a_call, model_calls=0)
    assert not sem.runs_again(before_a_call, model_calls=1)  # the policy's outcome stays sealed
    assert not sem.runs_again([], model_calls=0)  # completed (e.g. answered without calling the model)
    assert not sem.runs_again(["evaluator_error"], model_calls=0)  # the judging failed, not the session


def test_failure_reason_names_status_and_stage() -> None:
    assert sem.session_failure_reason("completed", None) is None
    assert sem.session_failure_reason("timeout", "harness") == "session_timeout:harness"
    assert sem.session_failure_reason("error", None) == "session_error:unknown"
    # a judging that failed is the evaluator's reason (evaluator_error), not the session's
    assert sem.session_failure_reason("error", "evaluate") is None


@pytest.mark.parametrize("per_batch,samples,groups", [(1, 3, 1), (3, 3, 1), (4, 3, 2), (6, 3, 2), (64, 8, 8), (5, 1, 5)])
def test_batches_hold_whole_groups_of_at_least_traces_per_batch_sessions(per_batch: int, samples: int, groups: int) -> None:
    assert sem.groups_per_batch(per_batch, samples) == groups
    assert groups * samples >= per_batch > (groups - 1) * samples


def test_next_batches_waits_for_full_batches_until_the_end() -> None:
    assert sem.next_batches([4, 1, 2], 2, final=False) == [[4, 1]]
    assert sem.next_batches([4, 1, 2], 2, final=True) == [[4, 1], [2]]
    assert sem.next_batches([], 2, final=True) == []
    assert sem.batch_count(3, 4, 3) == 2 and sem.batch_count(3, 3, 3) == 3


def test_presets_default_to_command_and_hook_is_the_python_evaluator() -> None:
    assert sem.harness_preset(None) == "command" and sem.harness_preset("codex") == "codex"
    assert [sem.evaluator_type(p) for p in (None, "command", "tests", "hook")] == ["command", "command", "tests", "python"]
    with pytest.raises(ValueError, match="expected one of tests, hook, command"):
        sem.evaluator_type("nope")


def test_the_operator_imports_nothing_of_the_runner() -> None:
    """The operator names the pod programs' module (names.POD_PROGRAMS); it never imports the runner."""
    import pkgutil
    import subprocess
    import sys

    import tracefleet.operator

    modules = [m.name for m in pkgutil.walk_packages(tracefleet.operator.__path__, "tracefleet.operator.")
               if not m.name.endswith("__main__")]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.startswith('tracefleet.runner')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "tracefleet.operator.children.jobs" in modules and "tracefleet.operator.reconcile" in modules
    assert out.stdout.strip() == "[]"
