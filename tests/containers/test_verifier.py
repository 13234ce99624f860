"""The Harbor verifier through real podman: a session simulated as the agent would leave it (commands run as root in a
container of the task's image, then its `change_set`), judged by the task's tests/test.sh in a fresh container of
the image with the change set applied. The reference solution passes and the untouched environment fails;
reward.json with two metrics; every fail-closed case with its reason; and an agent that plants a reward, edits the
tests, leaves a shadowing pytest.py / conftest.py / pytest.ini in the working directory, or replaces the image's
python3 or bash gains nothing."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from fixtures.harbor_tasks import SOLVE_SH, write_task
from tracefleet.harbor.folders import HarborTask, load_task
from tracefleet.runner.containers.images import build_task_image
from tracefleet.runner.containers.runtime import BASE_IMAGE, ContainerRuntime
from tracefleet.runner.containers.changes import change_set
from tracefleet.runner.containers.verifier import Verifier, verify

BASH_ONLY = f"FROM {BASE_IMAGE}\nWORKDIR /app\n"


@pytest.fixture(scope="module")
def greet_task(tmp_path_factory: pytest.TempPathFactory, container_runtime: ContainerRuntime) -> tuple[HarborTask, str]:
    """The greet task (Python and pytest in its image, from Debian's packages) and its built image. The image is
    named by content, so it is built once and found in podman's store afterwards."""
    task = load_task(write_task(tmp_path_factory.mktemp("tasks"), "greet"))
    result = build_task_image(container_runtime, task)
    assert result.status in ("built", "cached"), result.line()
    print(f"\ngreet image: {result.line()}")
    return task, result.image


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[Path]:
    """A folder for the sessions' change sets."""
    yield tmp_path / "sessions"


def agent_session(runtime: ContainerRuntime, image: str, script: str, sessions: Path) -> Path:
    """What an agent leaves: `script` run by bash (as root) in a container of the task's image; its change set."""
    name = f"tracefleet-test-session-{uuid.uuid4().hex[:8]}"
    try:
        runtime.run("run", "--name", name, "--entrypoint", "bash", image, "-c", script, timeout=120)
        change_set(runtime, name, sessions / name)
    finally:
        runtime.remove(name)
    return sessions / name


def test_the_reference_solution_passes_and_the_untouched_environment_fails(
        greet_task: tuple[HarborTask, str], container_runtime: ContainerRuntime, sessions: list[str],
        tmp_path: Path) -> None:
    task, image = greet_task
    untouched = verify(container_runtime, task, image)
    assert (untouched.status, untouched.reward, untouched.reward_file) == ("ok", 0.0, "reward.txt"), untouched
    assert "1 failed" in untouched.output_tail
    solved = agent_session(container_runtime, image, SOLVE_SH, sessions)
    start = time.monotonic()
    verdict = verify(container_runtime, task, image, changes=solved, log_dir=tmp_path / "verifier")
    took = time.monotonic() - start
    assert (verdict.status, verdict.reward, verdict.metrics) == ("ok", 1.0, {"reward": 1.0}), verdict
    assert verdict.exit_code == 0 and "1 passed" in verdict.output_tail
    assert (tmp_path / "verifier" / "reward.txt").read_text() == "1\n"
    print(f"verify (pytest task, fresh container of the image with the change set): {took:.2f} s")



def test_a_verifier_started_ahead_judges_the_change_set_it_is_given_later(
        greet_task: tuple[HarborTask, str], container_runtime: ContainerRuntime, sessions: Path) -> None:
    """How a session uses it (started while the agent works): the held container runs nothing of test.sh until its go,
    judges the change set made after it started; one cancelled (a session that failed) leaves no container."""
    task, image = greet_task
    ahead, cancelled = Verifier(container_runtime, task, image), Verifier(container_runtime, task, image)
    solved = agent_session(container_runtime, image, SOLVE_SH, sessions)  # the agent works after both started
    assert ahead.proc.poll() is None and not any(ahead.logs.iterdir())  # held: test.sh has not run
    verdict = ahead.judge(solved)
    assert (verdict.status, verdict.reward) == ("ok", 1.0), verdict
    cancelled.cancel()
    names = container_runtime.run("ps", "-a", "--format", "{{.Names}}").stdout.split()
    assert not {ahead.name, cancelled.name} & set(names), names
    assert not ahead.eval_dir.exists() and not cancelled.eval_dir.exists()


ATTACKS = {
    # a reward planted where Harbor's verifier reads it, both forms
    "planted-reward": "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt"
                      " && echo '{\"reward\": 1}' > /logs/verifier/reward.json",
    # the tests edited to pass, test.sh replaced to write a reward without running them
    "edited-tests": "mkdir -p /tests && printf 'def test_greets_harbor():\\n    pass\\n' > /tests/test_outputs.py"
                    " && printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh",
    # `python3 -m pytest` from /app would import this instead of pytest: it prints a pass and exits 0
    "shadowing-pytest.py": "printf 'print(\"test_outputs.py::test_greets_harbor PASSED\")\\nraise SystemExit(0)\\n'"
                           " > /app/pytest.py",
    # a conftest.py that turns every failure into a pass
    "conftest.py": "printf 'import pytest\\n\\n@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport("
                   "item, call):\\n    outcome = yield\\n    outcome.get_result().outcome = \"passed\"\\n'"
                   " > /app/conftest.py",
    # a pytest.ini that makes pytest collect without running anything (exit 0)
    "pytest.ini": "printf '[pytest]\\naddopts = --collect-only -q\\n' > /app/pytest.ini",
    # everything at once, and a sitecustomize.py for good measure
    "all-of-them": "true",
}
ATTACKS["all-of-them"] = " && ".join([*list(ATTACKS.values())[:-1], "printf 'import sys\\n' > /app/sitecustomize.py"])
# The image's own programs, replaced by an agent running as root: python3 (a link to python3.11 in Debian) and
# bash made to report a pass, a python3 earlier on PATH, a Python startup hook that ends every run with status 0.
FAKE_PASS = "#!/bin/sh\\necho 1 passed\\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\\nexit 0\\n"
ATTACKS.update({
    "replaced-python3": f"for p in /usr/bin/python3 /usr/bin/python3.11; do rm -f $p && printf '{FAKE_PASS}' > $p"
                        " && chmod 755 $p; done",
    "replaced-bash": f"rm -f /usr/bin/bash && printf '{FAKE_PASS}' > /usr/bin/bash && chmod 755 /usr/bin/bash",
    "python3-on-path-first": f"printf '{FAKE_PASS}' > /usr/local/bin/python3 && chmod 755 /usr/local/bin/python3",
    "startup-hook": "printf 'import os; os._exit(0)\\n' > /usr/lib/python3/dist-packages/zz.pth",
})


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_tampering_agent_gains_nothing(attack: str, greet_task: tuple[HarborTask, str],
                                         container_runtime: ContainerRuntime, sessions: list[str]) -> None:
    task, image = greet_task
    tampered = agent_session(container_runtime, image, ATTACKS[attack], sessions)
    verdict = verify(container_runtime, task, image, changes=tampered)
    assert (verdict.status, verdict.reward) == ("ok", 0.0), verdict
    assert "1 failed" in verdict.output_tail, verdict.output_tail


@pytest.mark.parametrize("attack", ["shadowing-pytest.py", "replaced-python3"])
def test_the_attacks_are_real_in_the_agents_own_container(
        attack: str, greet_task: tuple[HarborTask, str], container_runtime: ContainerRuntime, tmp_path: Path) -> None:
    """The control: the same test.sh in the agent's own filesystem (a commit of its container), run the plain way
    (no PYTHONSAFEPATH), pays the attack a reward of 1. So the test above fails if a measure goes."""
    task, image = greet_task
    name, snapshot = f"tracefleet-test-session-{uuid.uuid4().hex[:8]}", f"localhost/tracefleet-test-{attack.lower()}"
    shutil.copytree(task.tests_dir, tmp_path / "tests")
    (tmp_path / "logs").mkdir()
    try:
        container_runtime.run("run", "--name", name, "--entrypoint", "bash", image, "-c", ATTACKS[attack], timeout=120)
        container_runtime.run("commit", name, snapshot, timeout=120)
        container_runtime.run("run", "--rm", "-v", f"{tmp_path / 'tests'}:/tests", "-v",
                              f"{tmp_path / 'logs'}:/logs/verifier", "--entrypoint", "bash", snapshot, "/tests/test.sh",
                              timeout=120)
    finally:
        container_runtime.remove(name)
        container_runtime.run("rmi", "-f", snapshot, check=False, timeout=120)
    assert (tmp_path / "logs" / "reward.txt").read_text() == "1\n"


# ---------------------------------------------------------------- reward files and fail-closed verdicts


def _bash_task(root: Path, name: str, test_sh: str, timeout: float = 60.0, toml_extra: str = "") -> HarborTask:
    toml = f"[verifier]\ntimeout_sec = {timeout}\n{toml_extra}"
    return load_task(write_task(root, name, dockerfile=BASH_ONLY, env_files={}, test_files={},
                                test_sh="#!/bin/bash\n" + test_sh, toml=toml))


@pytest.fixture(scope="module")
def bash_image(tmp_path_factory: pytest.TempPathFactory, container_runtime: ContainerRuntime) -> str:
    task = _bash_task(tmp_path_factory.mktemp("bash"), "bash-only", "true\n")
    result = build_task_image(container_runtime, task)
    assert result.status in ("built", "cached"), result.line()
    return result.image


def test_reward_json_with_two_metrics(tmp_path: Path, bash_image: str, container_runtime: ContainerRuntime) -> None:
    task = _bash_task(tmp_path, "two-metrics", "echo '{\"reward\": 0.75, \"style\": 0.5}' > /logs/verifier/reward.json\n"
                                               "echo 0 > /logs/verifier/reward.txt\n")
    verdict = verify(container_runtime, task, bash_image)
    # reward.json wins over reward.txt (as in Harbor); its "reward" metric is the training reward.
    assert (verdict.status, verdict.reward, verdict.reward_file) == ("ok", 0.75, "reward.json")
    assert verdict.metrics == {"reward": 0.75, "style": 0.5}


FAIL_CLOSED = {
    "no-reward": ("echo checking; exit 2\n", "no_reward",
                  "test.sh wrote neither /logs/verifier/reward.txt nor reward.json (exit status 2: checking)"),
    "text-in-reward.txt": ("echo passed > /logs/verifier/reward.txt\n", "unreadable_reward",
                           "reward.txt does not hold one number: 'passed'"),
    "reward.json-without-reward": ("echo '{\"accuracy\": 1, \"style\": 0.5}' > /logs/verifier/reward.json\n",
                                   "no_reward", "reward.json has no 'reward' metric (it has accuracy, style)"),
    "reward.json-not-numbers": ("echo '{\"reward\": \"high\"}' > /logs/verifier/reward.json\n", "unreadable_reward",
                                "reward.json is not a JSON object of finite numbers: '{\"reward\": \"high\"}'"),
    "timeout": ("echo 1 > /logs/verifier/reward.txt; sleep 60\n", "timeout",
                "test.sh ran past [verifier].timeout_sec (2 s)"),
}


@pytest.mark.parametrize("case", list(FAIL_CLOSED))
def test_fail_closed_with_its_reason(case: str, tmp_path: Path, bash_image: str,
                                     container_runtime: ContainerRuntime) -> None:
    test_sh, status, reason = FAIL_CLOSED[case]
    task = _bash_task(tmp_path, case, test_sh, timeout=2.0 if case == "timeout" else 60.0)
    start = time.monotonic()
    verdict = verify(container_runtime, task, bash_image)
    assert (verdict.status, verdict.reward, verdict.reason) == (status, 0.0, reason), verdict
    assert verdict.failed_closed
    if case == "reward.json-without-reward":
        assert verdict.metrics == {"accuracy": 1.0, "style": 0.5}  # kept, not trained on
    if case == "timeout":
        assert time.monotonic() - start < 15
        names = container_runtime.run("ps", "-a", "--format", "{{.Names}}").stdout.split()
        assert not [n for n in names if n.startswith("tracefleet-verify-")], names


def test_an_image_that_does_not_run_is_an_error(tmp_path: Path, container_runtime: ContainerRuntime) -> None:
    task = _bash_task(tmp_path, "gone", "echo 1 > /logs/verifier/reward.txt\n")
    verdict = verify(container_runtime, task, "localhost/tracefleet-task/gone:0000")
    assert verdict.status == "error" and verdict.reward == 0.0
    assert verdict.reason is not None and verdict.reason.startswith("the verifier's container did not run: Error: ")


def test_the_tasks_network_mode_and_verifier_env(tmp_path: Path, bash_image: str,
                                                 container_runtime: ContainerRuntime) -> None:
    """[environment].network_mode = "no-network": the verifier's container has only loopback; [verifier].env
    reaches test.sh, and the working directory stays off Python's import path whatever it says."""
    test_sh = ('echo "nets: $(ls /sys/class/net | tr "\\n" " ")"\necho "env: $GREETING $PYTHONSAFEPATH"\n'
               'echo 1 > /logs/verifier/reward.txt\n')
    task = _bash_task(tmp_path, "offline", test_sh, toml_extra='[verifier.env]\nGREETING = "hi"\n'
                      'PYTHONSAFEPATH = ""\n[environment]\nnetwork_mode = "no-network"\n')
    verdict = verify(container_runtime, task, bash_image)
    assert (verdict.status, verdict.reward) == ("ok", 1.0), verdict
    assert "nets: lo \n" in verdict.output_tail and "env: hi 1\n" in verdict.output_tail, verdict.output_tail


def test_test_sh_runs_as_the_verifier_user(tmp_path: Path, bash_image: str, container_runtime: ContainerRuntime) -> None:
    task = _bash_task(tmp_path, "as-nobody", 'echo "uid: $(id -u)"\necho 1 > /logs/verifier/reward.txt\n',
                      toml_extra='user = "nobody"\n')
    verdict = verify(container_runtime, task, bash_image)
    assert (verdict.status, verdict.reward) == ("ok", 1.0), verdict
    assert "uid: 65534\n" in verdict.output_tail, verdict.output_tail
