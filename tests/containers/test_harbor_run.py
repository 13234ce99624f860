"""`tracefleet run` on Harbor task folders, through podman: a real harness CLI (Pi, driven by the scripted engine)
works inside each task's own container, the `harbor` evaluator (the job's default) judges by the task's test.sh in a
fresh container of a snapshot of the session's, and a trainer reads the rows through BatchReader. One job runs once
(module fixture) and the tests read it: a solved task with reward.json's two metrics, an agent that tampers with
the verifier's inputs, and every kind of bad input as a fail-closed row of its own while the job goes on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.harbor_tasks import SOLVE_SH, TASK_TOML, write_task
from fixtures.harnesses import harness_binary_path
from fixtures.local_runs import run_local
from tracefleet.engine.scripted import Script, ScriptRoute
from tracefleet.runner.containers.place import CONTAINER_GO, CONTAINER_RECORD, container_of
from tracefleet.runner.containers.reaper import RUN_LABEL
from tracefleet.runner.containers.runtime import BASE_IMAGE, STEPS_FILE, ContainerRuntime
from tracefleet.traces.reader import BatchReader

JOB = "harbor-local"
BASH_ONLY = f"FROM {BASE_IMAGE}\nWORKDIR /app\n"
# reward.json with two metrics: the tests' verdict, and whether what the agent wrote is in the container's /app
SOLVE_TEST_SH = """\
#!/bin/bash
if python3 -m pytest -q /tests/test_outputs.py; then r=1; else r=0; fi
if [ "$(cat /app/proof.txt 2>/dev/null)" = written-inside ]; then p=1; else p=0; fi
printf '{"reward": %s, "proof_in_container": %s}\\n' "$r" "$p" > /logs/verifier/reward.json
"""
# what an agent could leave for the verifier: a planted reward, edited tests, and a shadowing pytest.py, a conftest.py
# forcing passes and a pytest.ini in its working directory
TAMPER = [
    "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && echo '{\"reward\": 1}' > /logs/verifier/reward.json",
    "mkdir -p /tests && printf 'def test_greets_harbor():\\n    pass\\n' > /tests/test_outputs.py"
    " && printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh",
    "printf 'print(\"1 passed\")\\n' > pytest.py && printf 'import pytest\\n@pytest.hookimpl(hookwrapper=True)\\n"
    "def pytest_runtest_makereport(item, call):\\n    (yield).get_result().outcome = \"passed\"\\n' > conftest.py"
    " && printf '[pytest]\\naddopts = -p no:python\\n' > pytest.ini",
]
SOLVE = [SOLVE_SH.splitlines()[1], "echo written-inside > proof.txt"]
BAD = {  # task -> what the row's error must say
    "no-instruction": "no-instruction/instruction.md: missing",
    "bad-schema": "unsupported schema_version '2.0'",
    "bad-build": "image build failed",
    "no-reward": "test.sh wrote neither /logs/verifier/reward.txt nor reward.json",
    "text-reward": "reward.txt does not hold one number: 'yes'",
    "slow-verifier": "test.sh ran past [verifier].timeout_sec (3 s)",
}


def marked(task: str) -> str:
    return f"Do the task. [plan:{task}]\n"


def write_tasks(root: Path) -> None:
    write_task(root, "solve", instruction="Make /app/greet.py greet harbor. [plan:solve]\n", test_sh=SOLVE_TEST_SH)
    write_task(root, "tamper", instruction=marked("tamper"))
    write_task(root, "no-instruction", instruction=None)
    write_task(root, "bad-schema", toml=TASK_TOML.format(verifier_timeout=60).replace('"1.4"', '"2.0"'))
    write_task(root, "bad-build", dockerfile=f"FROM {BASE_IMAGE}\nRUN echo no such package >&2 && exit 3\n", env_files={})
    for name, test_sh, timeout in (("no-reward", "#!/bin/bash\necho the tests ran\n", 60),
                                   ("text-reward", "#!/bin/bash\necho yes > /logs/verifier/reward.txt\n", 60),
                                   ("slow-verifier", "#!/bin/bash\nsleep 60\n", 3)):
        write_task(root, name, instruction=marked(name), dockerfile=BASH_ONLY, env_files={}, test_sh=test_sh,
                   test_files={}, verifier_timeout=timeout,
                   # a limit this machine cannot hold: said in one line, the task runs
                   toml=TASK_TOML.format(verifier_timeout=timeout) + ("storage_mb = 512\n" if name == "no-reward" else ""))


@pytest.fixture(scope="module")
def harbor_job(container_runtime: ContainerRuntime, scripted_engine: Any,
               tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    harness_binary_path("pi")
    tmp = tmp_path_factory.mktemp("harbor-run")
    write_tasks(tmp / "tasks")
    routes = [ScriptRoute(marker="[plan:solve]", commands=SOLVE, final_text="Done."),
              ScriptRoute(marker="[plan:tamper]", commands=TAMPER, final_text="Done.")]
    routes += [ScriptRoute(marker=f"[plan:{name}]", commands=[], final_text="Done.") for name in BAD]
    scripted_engine.configure(**Script(routes=routes, tool_preference=["bash"], final_text="Done.").model_dump())
    body = {"apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": JOB}, "spec": {
        "inference": {"external": {"baseUrl": "http://127.0.0.1:1"}, "capture": {"mode": "server"}},
        "harness": {"preset": "pi", "sessionTimeoutSeconds": 180},
        "tasks": {"samplesPerTask": 1, "harbor": {"uri": "tasks"}},
        "parallelism": 3,
        "output": {"uri": str(tmp / "out"), "tracesPerBatch": 8}}}
    done, took = run_local(body, tmp, engine_url=scripted_engine.url, timeout_s=400)
    print(f"\nharbor job: {took:.1f} s\n{done.stderr[-3000:]}")
    reader = BatchReader(str(tmp / "out"), JOB)
    rows: dict[str, list[dict[str, Any]]] = {}
    for seq in reader.seqs():
        table = reader.read(seq).table
        for row in table.select(["task_id", "reward", "evaluator_reward", "outcome", "fail_closed_reasons",
                                 "num_trainable", "diagnostics", "metadata_json"]).to_pylist():
            row["extra"] = json.loads(row.pop("metadata_json"))["extra"]
            rows.setdefault(row["task_id"], []).append(row)
    patches = {json.loads((p.parent / "result.json").read_text())["task_id"]: p.read_text()
               for p in (tmp / "work" / "sessions").glob("*/*/session.patch")}
    return {"done": done, "rows": rows, "tmp": tmp, "patches": patches, "runtime": container_runtime}


def test_the_job_runs_every_task_and_goes_on_past_the_bad_ones(harbor_job: dict[str, Any]) -> None:
    done, rows = harbor_job["done"], harbor_job["rows"]
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(rows) == sorted(["solve", "tamper", *BAD]), done.stdout + done.stderr
    assert "task image bad-build: image build failed: " in done.stderr
    assert "tracefleet: no-reward: storage_mb 512 is not a limit here" in done.stderr, done.stderr


def test_the_harness_works_inside_the_tasks_container_and_test_sh_gives_the_reward(harbor_job: dict[str, Any]) -> None:
    rows, tmp = harbor_job["rows"]["solve"], harbor_job["tmp"]
    context = json.dumps(rows, default=str)[:3000]
    assert all(r["reward"] == 1.0 and r["outcome"] == "ok" for r in rows), context
    assert sum(r["num_trainable"] for r in rows) > 0, context
    evaluation = rows[0]["extra"]["evaluation"]
    # reward.json's two metrics, kept for the trainer; the second says the agent's write is in the container's /app
    assert evaluation["metrics"] == {"reward": 1.0, "proof_in_container": 1.0}, evaluation
    assert evaluation["details"]["reward_file"] == "reward.json"
    # ... and not on the host: nowhere under the job's folder, and the host's session folder has no greet.py
    assert not [p for p in tmp.rglob("proof.txt")] and not [p for p in tmp.rglob("greet.py") if "tasks" not in p.parts]
    # judged by the verifier the session started while the agent worked (held: seconds before its go)
    steps = [json.loads(line) for f in tmp.rglob(STEPS_FILE) for line in f.read_text().splitlines()]
    assert any(s["step"] == "run verifier" and s.get("held", 0) > 0 for s in steps), steps
    # the session's patch is the container's working directory against its image's: what the diagnostics read
    patch = harbor_job["patches"]["solve"]
    assert "diff --git a/greet.py b/greet.py" in patch and '+print("hello, harbor")' in patch, patch
    assert "diff --git a/proof.txt b/proof.txt" in patch and "+written-inside" in patch, patch
    assert not [f for r in rows for f in r["diagnostics"] if f["name"] == "success_without_work"], rows


def test_the_next_sessions_containers_start_ahead_and_none_is_left(harbor_job: dict[str, Any]) -> None:
    tmp, runtime = harbor_job["tmp"], harbor_job["runtime"]
    runs = [json.loads(line) for f in tmp.rglob(STEPS_FILE) for line in f.read_text().splitlines()
            if json.loads(line)["step"] == "run"]
    # more sessions than the parallelism of 3: those after the first were waiting in a container started ahead
    assert any(r["ahead"] == 1 and r["start"] < r["up"] for r in runs), runs
    names = [container_of(f.parent)["name"] for f in tmp.rglob(CONTAINER_RECORD)]
    assert names and not [n for n in names if runtime.run("container", "exists", n, check=False).returncode == 0]
    assert not list(tmp.rglob(CONTAINER_GO))  # the FIFO the spec went through: gone once read
    # nor any container the run started (those started ahead that no session took, verifiers), by the run's label
    assert runtime.run("ps", "-a", "-q", "--filter", f"label={RUN_LABEL}").stdout.split() == []


def test_an_agent_that_tampers_with_the_verifier_earns_nothing(harbor_job: dict[str, Any]) -> None:
    rows = harbor_job["rows"]["tamper"]
    evaluation = rows[0]["extra"]["evaluation"]
    # judged (status ok), on the task's own tests in a fresh /tests, the reward read from a fresh /logs/verifier:
    # the real test failed, the planted reward, tests, pytest.py, conftest.py and pytest.ini changed nothing
    assert evaluation["status"] == "ok" and evaluation["reward"] == 0.0, evaluation
    assert evaluation["metrics"] == {"reward": 0.0} and "1 failed" in evaluation["details"]["output_tail"], evaluation
    assert all(r["reward"] == 0.0 for r in rows)
    patch = harbor_job["patches"]["tamper"]  # what it left in /app is in its patch (/tests, /logs are not /app)
    assert all(f"diff --git a/{name} b/{name}" in patch for name in ("pytest.py", "conftest.py", "pytest.ini")), patch


@pytest.mark.parametrize("task", sorted(BAD))
def test_bad_input_is_one_line_and_a_fail_closed_row(task: str, harbor_job: dict[str, Any]) -> None:
    done, rows = harbor_job["done"], harbor_job["rows"][task]
    extra = rows[0]["extra"]
    error = extra["session_error"]
    assert BAD[task] in error and "\n" not in error, extra
    assert all(r["reward"] == 0.0 and r["outcome"] == "fail_closed" for r in rows), rows
    said = [line for line in done.stderr.splitlines() if BAD[task] in line]
    assert said and all(line.startswith("tracefleet: ") for line in said), done.stderr
    stage = extra["session_stage"]
    if task in ("no-instruction", "bad-schema", "bad-build"):  # refused before the harness ran
        assert stage == "prepare", extra
    else:  # the harness ran; the verifier failed closed with its reason, its status kept
        assert stage == "evaluate" and extra["evaluation"]["status"] in ("error", "timeout"), extra
        assert extra["session_status"] == ("timeout" if task == "slow-verifier" else "error"), extra


def test_without_a_container_runtime_a_task_that_needs_an_image_is_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    import yaml

    from tracefleet.runner.local import LocalOptions, LocalRun, job_tasks

    write_task(tmp_path / "tasks", "greet")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob",
                                   "metadata": {"name": "no-runtime"}, "spec": {
                                       "inference": {"external": {"baseUrl": "http://127.0.0.1:1"}},
                                       "harness": {"preset": "pi"}, "tasks": {"harbor": {"uri": "tasks"}},
                                       "output": {"uri": str(tmp_path / "out")}}}))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no podman, no docker
    progress = io.StringIO()
    local = LocalRun(LocalOptions(job_path=job, work_dir=tmp_path / "work"), out=progress)
    (task,) = local._task_images(job_tasks(local.job, tmp_path))
    assert task.harbor is not None and task.harbor.image is None
    assert task.harbor.refusal is not None and task.harbor.refusal.startswith("greet: needs its image, and no container "
                                                                             "runtime: ") and "\n" not in task.harbor.refusal
    assert task.prompt == "Make greet.py greet harbor.\n"  # instruction.md is the prompt
    assert task.metadata == {"difficulty": "easy"} and task.harbor.agent_timeout_s == 600.0  # [metadata], [agent]
    assert progress.getvalue().count("\n") == 1
    # a tarball source is unpacked into a folder of the run's own
    import tarfile

    with tarfile.open(tmp_path / "tasks.tgz", "w:gz") as tar:
        tar.add(tmp_path / "tasks", arcname="tasks")
    local.job.spec.tasks.harbor.uri = "tasks.tgz"
    (unpacked,) = job_tasks(local.job, tmp_path, tmp_path / "work")
    assert unpacked.id == "greet" and Path(unpacked.harbor.folder).is_relative_to(tmp_path / "work")
