"""A Harbor task's pods with the kubelet played by podman: the task-image containers run for real (the operator's own
`sh -c` programs in the base image), the tracefleet-image steps run here as the pod programs they are.

Harness pod: the session program's task-image place (runner.pod.task_image) launches an agent in the task
container through the shared volume; what the agent changed anywhere on the root filesystem comes back as the
change set, uploaded with the artifacts. Evaluator Job: the fetch step (the change set from the bucket, the tests
from the task source), the verify step in a FRESH container of the task image, the report step's verdict. An agent
that solves the task earns 1; one that plants a reward, rewrites /tests and runs past its time earns 0.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

from fixtures.harnesses import harness_binary_path
from fixtures.pod_reads import pod_inputs
from tracefleet.bucket import open_bucket
from tracefleet.contract import layout
from tracefleet.contract import task_image as ti
from tracefleet.contract.harbor import HarborTaskRun
from tracefleet.contract.podenv import EvaluatorEnv, HarnessEnv
from tracefleet.contract.session import EvaluatorSpec, HarnessConfig, SessionPlan, SessionResult, Task
from tracefleet.runner.containers.bundle import make_bundle
from tracefleet.harbor.task_image_programs import LAUNCHER, VERIFIER
from tracefleet.runner.containers.runtime import BASE_IMAGE, ContainerRuntime
from tracefleet.contract.environment import HARDENED_PYTHON_ENV
from tracefleet.runner.pod.harbor_verifier import fetch, report
from tracefleet.runner.pod.task_image import TaskImagePlace
from tracefleet.runner.session import SessionFolders

TASK = "answer"
TEST_SH = """#!/bin/bash
if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ] && [ ! -e /etc/issue ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
# the harness CLI from the bundle (Pi, with the bundle's own Node.js: the base image has none), first on PATH
SOLVE = ("echo 42 > answer.txt && rm /etc/issue && echo \"worked in $PWD, home $HOME, mark $MARK\" && pi --version 2>&1 "
         "&& command -v pi")
CHEAT = ("echo 41 > answer.txt; mkdir -p /logs/verifier /tests; echo 1 > /logs/verifier/reward.txt; "
         "printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh; sleep 600")


def _task_source(root: Path) -> Path:
    folder = root / "tasks" / TASK
    (folder / "tests").mkdir(parents=True)
    (folder / "task.toml").write_text('schema_version = "1.4"\n[verifier]\ntimeout_sec = 30\n'
                                      '[environment]\nworkdir = "/app"\n')
    (folder / "instruction.md").write_text("Write 42 to answer.txt and remove /etc/issue.\n")
    (folder / "tests" / "test.sh").write_text(TEST_SH)
    return folder.parent


def _plan(tasks: Path, timeout_s: float) -> SessionPlan:
    """The session's plan, as the operator ships it (in files: tracefleet.contract.plan_files)."""
    task = Task(id=TASK, prompt="p", harbor=HarborTaskRun(folder=str(tasks), verifier_timeout_s=30))
    return SessionPlan(index=0, session_id="hb-s0", job="hb", task=task, sample_index=0, group_id=f"hb/{TASK}",
                       harness=HarnessConfig(timeout_s=timeout_s), evaluator=EvaluatorSpec(type="harbor"), model="m")


def _session(runtime: ContainerRuntime, root: Path, name: str, agent: str, timeout_s: float) -> tuple[Path, SessionResult]:
    """One harness pod: the bundle as the init container leaves it, the task container (podman) and the session
    program's place (here); its artifacts."""
    shared, home, work, artifacts = (root / name / d for d in ("shared", "home", "work", "artifacts"))
    for d in (shared / "launch", home, work, artifacts):
        d.mkdir(parents=True)
    make_bundle(shared / "bundle", {"pi": harness_binary_path("pi").parents[2]}, link=True)
    container = f"h20k-{name}-{int(time.time())}"
    task_container = subprocess.Popen(
        runtime.command("run", "--rm", "--name", container, "-v", f"{shared}:{ti.SHARED_DIR}", "-v", f"{home}:{home}",
                        "-e", "TRACEFLEET_TASK_WORKDIR=/app", BASE_IMAGE, "sh", "-c", LAUNCHER),
        env={**__import__("os").environ, **runtime.env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        plan = _plan(root / "tasks", timeout_s)
        env = {**pod_inputs(HarnessEnv(plan=plan, base_url="http://127.0.0.1:1", api_key="k", artifacts_dir=str(artifacts),
                                       work_dir=str(work), launch_dir=str(shared / "launch")), root / name / "plan"),
               "HOME": str(home)}
        place = TaskImagePlace(env, threading.Event())
        workdir = work / "workdir"  # what the session program prepared: it stands for the task's workdir
        proc = place.run(None, ["sh", "-c", agent], cwd=workdir, home=home,  # type: ignore[arg-type]
                         env={"MARK": f"{workdir}/x"}, timeout_s=timeout_s,
                         stdout_path=artifacts / layout.HARNESS_STDOUT, stderr_path=artifacts / layout.HARNESS_STDERR)
        result = SessionResult.for_plan(plan, work)
        result.harness_exit_code = proc.exit_code
        result.status = "timeout" if proc.timed_out else "completed"
        place.finish(result, SessionFolders(work=work, artifacts=artifacts, home=home))
        task_container.wait(timeout=60)
    finally:
        runtime.remove(container)
    return artifacts, result


def _evaluate(runtime: ContainerRuntime, root: Path, name: str, artifacts: Path, tasks: Path) -> float:
    """One evaluator Job: fetch (here), verify (podman, a fresh task container), report (here)."""
    bucket_dir, shared, tests, logs = (root / name / d for d in ("bucket", "eval-shared", "tests", "logs"))
    for d in (bucket_dir, shared, tests, logs):
        d.mkdir(parents=True)
    bucket = open_bucket(bucket_dir)
    for f in artifacts.iterdir():
        bucket.put(layout.artifacts_prefix("hb", 0) + f.name, f.read_bytes())
    env = EvaluatorEnv.from_env(pod_inputs(EvaluatorEnv(bucket=str(bucket_dir), plan=_plan(tasks, 60)), root / name / "ev-plan"))
    assert fetch(bucket, env, shared / "eval") is None
    environment = {**HARDENED_PYTHON_ENV, "TRACEFLEET_TASK_WORKDIR": "/app", "TRACEFLEET_VERIFIER_TIMEOUT_S": "30"}
    runtime.run("run", "--rm", "-v", f"{shared}:{ti.SHARED_DIR}", "-v", f"{tests}:/tests", "-v", f"{logs}:/logs/verifier",
                *(a for k, v in environment.items() for a in ("-e", f"{k}={v}")), BASE_IMAGE, "sh", "-c", VERIFIER,
                timeout=120)
    verdict, code = report(bucket, env, shared / "eval", logs)
    assert code == 0 and verdict.evaluator == ti.HARBOR_EVALUATOR
    return verdict.reward if verdict.status == "ok" else -1.0


def test_task_image_pods_judge_what_the_agent_changed(container_runtime: ContainerRuntime, tmp_path: Path) -> None:
    tasks = _task_source(tmp_path)
    solved, solved_result = _session(container_runtime, tmp_path, "solve", SOLVE, timeout_s=60)
    out = (solved / layout.HARNESS_STDOUT).read_text()
    # the agent worked in the task's workdir (the session's workspace path mapped there), with the pod's HOME
    assert out.splitlines() == [f"worked in /app, home {tmp_path}/solve/home, mark /app/x", "0.73.1",
                                f"{ti.BUNDLE_BIN}/pi"], out
    assert solved_result.harness_exit_code == 0
    assert (solved / ti.DELETED).read_text().splitlines() == ["/etc/issue"]
    members = subprocess.run(["tar", "tf", solved / ti.CHANGES], capture_output=True, text=True, check=True).stdout.split()
    assert "app/answer.txt" in members and not any(m.startswith(("tracefleet", "proc", "tests")) for m in members)
    assert (solved / layout.RESULT).is_file()

    started = time.monotonic()
    cheated, cheat_result = _session(container_runtime, tmp_path, "cheat", CHEAT, timeout_s=3)
    assert time.monotonic() - started < 40 and cheat_result.status == "timeout"  # stopped, its change set collected
    members = subprocess.run(["tar", "tf", cheated / ti.CHANGES], capture_output=True, text=True, check=True).stdout.split()
    assert "app/answer.txt" in members and "logs/verifier/reward.txt" not in members

    assert _evaluate(container_runtime, tmp_path, "solve", solved, tasks) == 1.0
    # a planted reward, a rewritten /tests/test.sh: neither reaches the fresh verifier container
    assert _evaluate(container_runtime, tmp_path, "cheat", cheated, tasks) == 0.0
    shutil.rmtree(tmp_path / "solve", ignore_errors=True)


def test_the_report_step_fails_closed_with_one_line(tmp_path: Path) -> None:
    """What the verify step left, read by the report step: each failure is reward 0 with its reason; test.sh that
    ran and left no reward stays the policy's `error` (it ran in the agent's environment)."""
    from tracefleet.runner.containers.harbor_outcome import eval_outcome_of_verdict
    from tracefleet.runner.pod.harbor_verifier import verdict_here

    def case(files: dict[str, str], reward: str | None = None) -> tuple[str, float, str | None]:
        eval_dir, logs = tmp_path / f"e{len(list(tmp_path.iterdir()))}", tmp_path / f"l{len(list(tmp_path.iterdir()))}"
        eval_dir.mkdir()
        logs.mkdir()
        for name, text in files.items():
            (eval_dir / name).write_text(text)
        if reward is not None:
            (logs / "reward.txt").write_text(reward)
        outcome = eval_outcome_of_verdict(verdict_here(eval_dir, logs, 30))
        return outcome.status, outcome.reward, outcome.message

    assert case({ti.EXIT_CODE: "0\n", ti.DURATION: "2\n"}, "0.5\n")[:2] == ("ok", 0.5)
    # test.sh never ran (its inputs or its container): the infrastructure's (tracefleet.contract.semantics)
    assert case({ti.FETCH_ERROR: "the harness pod uploaded no change set (x)\n"}) == (
        "unavailable", 0.0, "harbor verifier: the harness pod uploaded no change set (x)")
    assert case({}) == ("unavailable", 0.0, "harbor verifier: the task image's verify step left no exit status (did it run?)")
    assert case({ti.EXIT_CODE: "124\n", ti.TIMED_OUT: ""}, "1\n") == (
        "timeout", 0.0, "harbor verifier: test.sh ran past [verifier].timeout_sec (30 s)")
    status, reward, message = case({ti.EXIT_CODE: "0\n"}, "passed\n")
    assert (status, reward) == ("error", 0.0) and "reward.txt does not hold one number: 'passed'" in (message or "")
    status, reward, message = case({ti.EXIT_CODE: "1\n", ti.TEST_OUTPUT: "boom\n"})
    assert (status, reward) == ("error", 0.0) and message.endswith("(exit status 1: boom)")


def test_the_session_patch_is_the_task_workdir_against_the_images(tmp_path: Path) -> None:
    """session.patch on a task-image pod (what the diagnostics read): the launcher's copy of the working directory
    before the harness (`tar -cpf … .` in it), with the change set's part under that directory applied (a modified
    file, a new one, a deletion), and nothing from elsewhere on the root filesystem."""
    import io
    import tarfile

    shared, home, work, artifacts = (tmp_path / d for d in ("shared", "home", "work", "artifacts"))
    launch = shared / "launch"
    for d in (launch, home, work, artifacts):
        d.mkdir(parents=True)

    def tar(path: Path, files: dict[str, str]) -> None:
        with tarfile.open(path, "w") as out:
            for name, text in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(text.encode())
                out.addfile(info, io.BytesIO(text.encode()))

    (launch / ti.READY).write_text("/app\n")
    tar(launch / ti.WORKDIR_BEFORE, {"./keep.txt": "same\n", "./edit.py": "x = 1\n", "./gone.txt": "bye\n"})
    tar(launch / ti.CHANGES, {"app/edit.py": "x = 2\n", "app/new.txt": "hello\n", "etc/issue": "elsewhere\n",
                              "application/x": "a sibling folder\n"})
    (launch / ti.DELETED).write_text("/app/gone.txt\n/etc/motd\n")
    (launch / ti.EXIT_CODE).write_text("0\n")
    place = TaskImagePlace({**pod_inputs(HarnessEnv(plan=_plan(tmp_path / "tasks", 30), base_url="http://127.0.0.1:1",
                                                    api_key="k", artifacts_dir=str(artifacts), work_dir=str(work),
                                                    launch_dir=str(launch)), tmp_path / "plan"),
                            "HOME": str(home)})
    folders = SessionFolders(work=work, artifacts=artifacts, home=home)
    patch = place.workspace_diff(None, folders)  # type: ignore[arg-type]
    changed = sorted(line.split(" b/")[-1] for line in patch.splitlines() if line.startswith("diff --git"))
    assert changed == ["edit.py", "gone.txt", "new.txt"], patch
    assert "-x = 1\n+x = 2" in patch and "deleted file mode" in patch and "+hello" in patch, patch
    assert not (work / "container-diff").exists()
    (launch / ti.WORKDIR_BEFORE).unlink()  # a working directory of `/`: no patch
    assert place.workspace_diff(None, folders) == ""  # type: ignore[arg-type]
