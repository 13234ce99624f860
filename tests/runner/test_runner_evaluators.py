"""Workspace, sandbox and evaluators against real git, real processes and real pytest runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tracefleet.runner.evaluators import EvalContext, EvaluatorSpec, get_evaluator
from tracefleet.runner.sandbox import run_sandboxed
from tracefleet.runner.task import Task
from tracefleet.runner.workspace import prepare_workspace, workspace_patch

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


def calc_task(**extra) -> Task:
    return Task(
        id="calc",
        prompt="fix add",
        repo=str(QUICKSTART / "tasks" / "calc"),
        FAIL_TO_PASS=["test_calc.py::test_add"],
        PASS_TO_PASS=["test_calc.py::test_mul"],
        protected=["test_calc.py"],
        **extra,
    )


def session_with(tmp_path: Path, edit) -> EvalContext:
    task = calc_task()
    ws = prepare_workspace(task, tmp_path / "s")
    edit(ws.workdir)
    patch = workspace_patch(ws.workdir, ws.base_commit)
    return EvalContext(task=task, workspace=ws, patch=patch, session_dir=tmp_path / "s", harness_exit_code=0)


def fix(workdir: Path) -> None:
    src = workdir / "calc.py"
    src.write_text(src.read_text().replace("return a - b", "return a + b"))


def test_workspace_is_a_fresh_repo_and_patch_has_untracked_files(tmp_path: Path) -> None:
    task = calc_task()
    ws = prepare_workspace(task, tmp_path / "s")
    assert (ws.workdir / ".git").is_dir() and not (QUICKSTART / "tasks" / "calc" / ".git").exists()
    fix(ws.workdir)
    (ws.workdir / "notes.txt").write_text("new file\n")
    patch = workspace_patch(ws.workdir, ws.base_commit)
    assert "+    return a + b" in patch and "notes.txt" in patch
    # the byte-code and test caches a test run leaves are not changes
    subprocess.run([sys.executable, "-m", "compileall", "-q", "."], cwd=ws.workdir, check=True)
    (ws.workdir / ".pytest_cache" / "v").mkdir(parents=True)
    (ws.workdir / ".pytest_cache" / "v" / "lastfailed").write_text("{}")
    assert list((ws.workdir / "__pycache__").glob("calc.*.pyc"))
    assert workspace_patch(ws.workdir, ws.base_commit) == patch
    # the original stays pristine
    assert "return a - b" in (ws.original / "calc.py").read_text()


def test_tests_evaluator_rewards_a_fixing_patch(tmp_path: Path) -> None:
    ctx = session_with(tmp_path, fix)
    outcome = get_evaluator(EvaluatorSpec(type="tests")).evaluate(ctx)
    assert outcome.status == "ok", outcome
    assert outcome.reward == 1.0
    assert outcome.details["fail_to_pass"] == {"test_calc.py::test_add": True}


def test_tests_evaluator_gives_zero_to_a_patch_that_does_not_fix(tmp_path: Path) -> None:
    ctx = session_with(tmp_path, lambda w: (w / "calc.py").write_text((w / "calc.py").read_text() + "\n# hm\n"))
    outcome = get_evaluator(EvaluatorSpec(type="tests")).evaluate(ctx)
    assert outcome.status == "ok"
    assert outcome.reward == 0.0
    assert outcome.details["fail_to_pass"] == {"test_calc.py::test_add": False}
    assert outcome.details["pass_to_pass"] == {"test_calc.py::test_mul": True}


def test_tests_evaluator_ignores_edits_to_protected_tests(tmp_path: Path) -> None:
    def cheat(w: Path) -> None:
        (w / "test_calc.py").write_text("def test_add():\n    pass\n\ndef test_mul():\n    pass\n")

    outcome = get_evaluator(EvaluatorSpec(type="tests")).evaluate(session_with(tmp_path, cheat))
    assert outcome.reward == 0.0


def test_tests_evaluator_breaking_a_passing_test_gives_zero(tmp_path: Path) -> None:
    def fix_and_break(w: Path) -> None:
        (w / "calc.py").write_text("def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return 0\n")

    outcome = get_evaluator(EvaluatorSpec(type="tests")).evaluate(session_with(tmp_path, fix_and_break))
    assert outcome.reward == 0.0 and outcome.details["fail_to_pass"] == {"test_calc.py::test_add": True}


def test_tests_evaluator_per_test_mode_uses_exit_codes(tmp_path: Path) -> None:
    spec = EvaluatorSpec(type="tests", per_test=True, command="{python} -m pytest -q {test}")
    assert get_evaluator(spec).evaluate(session_with(tmp_path / "a", fix)).reward == 1.0
    assert get_evaluator(spec).evaluate(session_with(tmp_path / "b", lambda w: None)).reward == 0.0


def test_command_evaluator_exit_code_and_json_reward(tmp_path: Path) -> None:
    ctx = session_with(tmp_path, fix)
    by_exit = get_evaluator(EvaluatorSpec(type="command", command=f"{sys.executable} -m pytest -q")).evaluate(ctx)
    assert (by_exit.status, by_exit.reward) == ("ok", 1.0)
    script = "grep -q 'a + b' calc.py && echo '{\"reward\": 0.75, \"why\": \"fixed\"}'"
    by_json = get_evaluator(EvaluatorSpec(type="command", command=script)).evaluate(ctx)
    assert by_json.reward == 0.75 and by_json.details["why"] == "fixed"
    failing = get_evaluator(EvaluatorSpec(type="command", command="exit 3")).evaluate(ctx)
    assert (failing.status, failing.reward, failing.details["exit_code"]) == ("ok", 0.0, 3)


def test_evaluator_timeout_and_crash_fail_closed(tmp_path: Path) -> None:
    ctx = session_with(tmp_path, fix)
    slow = get_evaluator(EvaluatorSpec(type="command", command="echo '{\"reward\": 1}'; sleep 30", timeout_s=1))
    started = time.monotonic()
    outcome = slow.evaluate(ctx)
    assert outcome.status == "timeout" and outcome.reward == 0.0
    assert "ran past its limit of 1 s (stopped after " in outcome.message, outcome.message  # as configured
    assert time.monotonic() - started < 10
    bad_json = get_evaluator(EvaluatorSpec(type="command", command="echo '{\"reward\": \"NaN\"}'")).evaluate(ctx)
    assert bad_json.status == "error" and bad_json.reward == 0.0
    missing = get_evaluator(EvaluatorSpec(type="command", command=["/nonexistent/judge"])).evaluate(ctx)
    assert missing.status == "unavailable" and missing.reward == 0.0  # the judge's own program: not the agent's doing


def test_an_evaluator_says_it_could_not_judge_only_where_the_agent_could_not_cause_it(tmp_path: Path) -> None:
    """`unavailable` (the infrastructure's: left out of training) vs `error` (the policy's): tracefleet.contract.semantics."""
    ctx = session_with(tmp_path, fix)
    down = get_evaluator(EvaluatorSpec(type="command", command="echo grading service down >&2; exit 75")).evaluate(ctx)
    assert (down.status, down.reward, down.message) == ("unavailable", 0.0, "evaluator command could not judge (exit 75): "
                                                                            "grading service down")
    # a JSON reward line is the judge's verdict whatever the exit status
    judged = get_evaluator(EvaluatorSpec(type="command", command="echo '{\"reward\": 1}'; exit 75")).evaluate(ctx)
    assert (judged.status, judged.reward) == ("ok", 1.0)

    # a judge program in the judged copy that the agent removed: the agent's doing
    def remove_judge(workdir: Path) -> None:
        fix(workdir)
        (workdir / "calc.py").rename(workdir / "calc_moved.py")

    removed = session_with(tmp_path / "removed", remove_judge)
    gone = get_evaluator(EvaluatorSpec(type="command", command=["./calc.py"])).evaluate(removed)
    assert gone.status == "error" and gone.reward == 0.0

    # the agent deleted the tests (not protected): the test run has no report; that stays the policy's
    def delete_tests(workdir: Path) -> None:
        (workdir / "test_calc.py").unlink()

    task = calc_task().model_copy(update={"protected": []})
    ws = prepare_workspace(task, tmp_path / "deleted" / "s")
    delete_tests(ws.workdir)
    deleted = EvalContext(task=task, workspace=ws, patch=workspace_patch(ws.workdir, ws.base_commit),
                          session_dir=tmp_path / "deleted" / "s", harness_exit_code=0)
    outcome = get_evaluator(EvaluatorSpec(type="tests")).evaluate(deleted)
    assert outcome.status == "error" and outcome.reward == 0.0, outcome
    # even when the agent's code exits with the "could not judge" status under the test run
    exits = get_evaluator(EvaluatorSpec(type="tests", command="{python} -c 'import sys; sys.exit(75)'")).evaluate(
        session_with(tmp_path / "exits", fix))
    assert exits.status == "error" and exits.reward == 0.0, exits


def test_a_judging_that_could_not_run_is_judged_again(tmp_path: Path) -> None:
    """Where the session's patch is still there (here, and in the evaluator Job: runner.session.judge)."""
    from tracefleet.runner.session import judge
    from tracefleet.contract.session import HarnessConfig, SessionPlan

    ctx = session_with(tmp_path, fix)
    counter = tmp_path / "judgings"
    flaky = f"echo x >> {counter}; [ $(wc -l < {counter}) -ge 2 ] || exit 75; {sys.executable} -m pytest -q"
    plan = SessionPlan(index=0, session_id="j-s0", job="j", task=ctx.task, group_id="j/calc", harness=HarnessConfig(),
                       evaluator=EvaluatorSpec(type="command", command=flaky), model="m")
    outcome = judge(plan, ctx)
    assert (outcome.status, outcome.reward, outcome.details["attempts"]) == ("ok", 1.0, 2)
    always = plan.model_copy(update={"evaluator": EvaluatorSpec(type="command", command="exit 75")})
    outcome = judge(always, ctx)
    assert (outcome.status, outcome.details["attempts"]) == ("unavailable", 2)


def test_unappliable_patch_is_patch_failed(tmp_path: Path) -> None:
    ctx = session_with(tmp_path, fix)
    ctx.patch = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,1 +1,1 @@\n-nope\n+x\n"
    outcome = get_evaluator(EvaluatorSpec(type="tests")).evaluate(ctx)
    assert outcome.status == "patch_failed" and outcome.reward == 0.0


def test_python_hook_evaluator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "my_hooks.py").write_text(
        textwrap.dedent(
            """
            def judge(ctx):
                return {"reward": 1.0 if "a + b" in ctx["patch"] else 0.0, "task": ctx["task"]["id"]}

            def boom(ctx):
                raise RuntimeError("evaluator bug")
            """
        )
    )
    ctx = session_with(tmp_path / "w", fix)
    spec = EvaluatorSpec(type="python", entrypoint="my_hooks:judge", env={"PYTHONPATH": str(hooks)})
    outcome = get_evaluator(spec).evaluate(ctx)
    assert (outcome.status, outcome.reward, outcome.details["task"]) == ("ok", 1.0, "calc")
    crash = get_evaluator(spec.model_copy(update={"entrypoint": "my_hooks:boom"})).evaluate(ctx)
    assert crash.status == "error" and crash.reward == 0.0 and "evaluator bug" in crash.details["stderr_tail"]


def test_sandbox_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {pidfile}; wait"
    result = run_sandboxed(
        ["/bin/sh", "-c", script], cwd=tmp_path, home=tmp_path / "home", timeout_s=1,
        stdout_path=tmp_path / "o", stderr_path=tmp_path / "e",
    )
    assert result.timed_out and result.exit_code is not None
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


def test_sandbox_own_home_cwd_and_clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "must-not-leak")
    result = run_sandboxed(
        [sys.executable, "-c", "import os; print(os.getcwd()); print(os.environ['HOME']); "
         "print(os.environ.get('AWS_SECRET_ACCESS_KEY')); print(os.getpgid(0) == os.getpid())"],
        cwd=tmp_path, home=tmp_path / "h", env={"EXTRA": "1"}, timeout_s=30,
        stdout_path=tmp_path / "o", stderr_path=tmp_path / "e",
    )
    assert result.exit_code == 0
    cwd, home, secret, own_group = (tmp_path / "o").read_text().split()
    assert (cwd, home, secret, own_group) == (str(tmp_path), str(tmp_path / "h"), "None", "True")


def test_sandbox_stop_event_interrupts(tmp_path: Path) -> None:
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    result = run_sandboxed(
        ["sleep", "60"], cwd=tmp_path, home=tmp_path / "h", timeout_s=60,
        stdout_path=tmp_path / "o", stderr_path=tmp_path / "e", stop=stop,
    )
    assert result.stopped and not result.timed_out and result.duration_s < 10


def test_workspace_from_a_git_repo_at_a_ref_and_from_an_archive(tmp_path: Path) -> None:
    import subprocess
    import tarfile

    repo = tmp_path / "upstream"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    (repo / "f.txt").write_text("v1\n")
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "v1"], cwd=repo, check=True)
    first = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    (repo / "f.txt").write_text("v2\n")
    subprocess.run([*git, "commit", "-qam", "v2"], cwd=repo, check=True)
    ws = prepare_workspace(Task(id="r", prompt="p", repo=str(repo), ref=first, setup=["echo built > built.txt"]), tmp_path / "a")
    assert (ws.workdir / "f.txt").read_text() == "v1\n" and (ws.workdir / "built.txt").exists()
    assert workspace_patch(ws.workdir, ws.base_commit) == ""  # setup output is part of the base

    archive = tmp_path / "src.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(QUICKSTART / "tasks" / "calc", arcname="calc")
    ws = prepare_workspace(Task(id="a", prompt="p", archive=str(archive)), tmp_path / "b")
    assert (ws.workdir / "calc.py").exists() and (ws.workdir / ".git").is_dir()


# What an agent can leave in its workspace to pass the tests without fixing anything (issue 20). Each earns nothing:
# the judge's Python does not import the workspace first, pytest reads no conftest.py / pytest.ini of it, and the
# verdict is the JUnit report written outside the workspace, not the lines printed.
PLANTS = {
    # a two-line pytest.py: `python -m pytest` from the workspace would run it, printing the summary lines wanted
    "shadowing-pytest": {"pytest.py": "print('PASSED test_calc.py::test_add')\nprint('PASSED test_calc.py::test_mul')\n"},
    # a conftest.py that turns every failure into a pass
    "conftest": {"conftest.py": textwrap.dedent("""\
        import pytest

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(item, call):
            outcome = yield
            report = outcome.get_result()
            report.outcome = "passed"
        """)},
    # a pytest.ini whose options deselect the failing test and print a forged pass
    "pytest-ini": {"pytest.ini": "[pytest]\naddopts = -p no:cacheprovider --deselect test_calc.py::test_add -k mul\n"},
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
@pytest.mark.parametrize("preset", ["tests", "command"])
def test_what_the_agent_leaves_in_the_workspace_earns_nothing(plant: str, preset: str, tmp_path: Path) -> None:
    def leave(w: Path) -> None:
        for rel, text in PLANTS[plant].items():
            (w / rel).write_text(text)

    spec = EvaluatorSpec(type="tests") if preset == "tests" else EvaluatorSpec(
        type="command", command=["python", "-m", "pytest", "-q", "test_calc.py"])
    outcome = get_evaluator(spec).evaluate(session_with(tmp_path, leave))
    assert outcome.reward == 0.0, outcome
    if preset == "tests":  # judged, from the report: the real test_add failed, test_mul passed
        assert outcome.status == "ok" and outcome.details["fail_to_pass"] == {"test_calc.py::test_add": False}, outcome
        assert outcome.details["pass_to_pass"] == {"test_calc.py::test_mul": True}
