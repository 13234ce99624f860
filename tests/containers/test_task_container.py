"""What a Harbor task's container is, read from inside it: `tracefleet run` with the `command` preset running a
small Node.js program in each task's container (the host's node, mounted), which prints what it sees there: its
environment (a `harness.env` value and the instruction, both with newlines, byte for byte), its cgroup's cpu and
memory limits (task.toml's [environment].cpus and memory_mb), its user ([agent].user), and its network interfaces (task.toml's network_mode:
none by default, the proxy always reachable). One job runs once (module fixture) and the tests read each session's
harness.stdout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.harbor_tasks import INSTRUCTION, MULTI, REPORT_JS, write_task
from fixtures.local_runs import run_local
from tracefleet.runner.containers.runtime import BASE_IMAGE, ContainerRuntime

JOB = "harbor-inside"
TOML = """schema_version = "1.4"
[verifier]
timeout_sec = 30
[environment.env]
TASK_ENV = "from task.toml"
[environment]
docker_image = "{image}"
workdir = "/app"
{extra}
"""
TASKS = {  # task -> the lines it adds to [environment]
    "limited": "cpus = 1.5\nmemory_mb = 300",
    "public": 'network_mode = "public"\n[agent]\nuser = "nobody"',
}
TEST_SH = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"


@pytest.fixture(scope="module")
def inside(container_runtime: ContainerRuntime, scripted_engine: Any,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("harbor-inside")
    for name, extra in TASKS.items():
        write_task(tmp / "tasks", name, toml=TOML.format(image=BASE_IMAGE, extra=extra), instruction=INSTRUCTION,
                   dockerfile=None, test_sh=TEST_SH, test_files={}, solve_sh=None)
    body = {"apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": JOB}, "spec": {
        "inference": {"external": {"baseUrl": "http://127.0.0.1:1"}, "capture": {"mode": "server"}},
        "harness": {"preset": "command", "command": ["node", "-e", REPORT_JS], "env": {"MULTI": MULTI},
                    "sessionTimeoutSeconds": 120},
        "tasks": {"samplesPerTask": 1, "harbor": {"uri": "tasks"}},
        "parallelism": 2,
        "output": {"uri": str(tmp / "out"), "tracesPerBatch": 8}}}
    done, took = run_local(body, tmp, engine_url=scripted_engine.url, timeout_s=300)
    print(f"\njob: {took:.1f} s")
    assert done.returncode == 0, done.stdout + done.stderr
    out: dict[str, dict[str, Any]] = {}
    for result in (tmp / "work" / "sessions").glob("*/*/result.json"):
        task = json.loads(result.read_text())["task_id"]
        stdout = next(result.parent.rglob("harness.stdout")).read_text()
        assert stdout.strip(), f"{task}: no report: {done.stderr[-2000:]}"
        out[task] = json.loads(stdout.strip().splitlines()[-1])
    assert sorted(out) == sorted(TASKS), done.stderr[-3000:]
    return out


def test_every_value_reaches_the_task_container_byte_for_byte(inside: dict[str, dict[str, Any]]) -> None:
    for report in inside.values():
        assert report["multi"] == MULTI
        assert report["prompt"] == INSTRUCTION
        assert report["task_env"] == "from task.toml"  # [environment].env, under the session's own


def test_the_tasks_cpu_and_memory_are_the_containers_cgroup_limits(inside: dict[str, dict[str, Any]]) -> None:
    report = inside["limited"]
    if report["cpu_max"] is not None:  # cgroup v2
        quota, period = map(int, report["cpu_max"].split())
        memory = int(report["memory_max"])
    else:
        quota, period, memory = int(report["cpu_quota"]), int(report["cpu_period"]), int(report["memory"])
    assert quota / period == 1.5, report
    assert memory == 300 * 1024 * 1024, report


def test_no_network_by_default_public_when_the_task_says_so_and_the_proxy_always(
        inside: dict[str, dict[str, Any]]) -> None:
    assert inside["limited"]["nets"] == ["lo"], inside["limited"]  # task.toml names no network_mode
    assert "lo" in inside["public"]["nets"] and len(inside["public"]["nets"]) > 1, inside["public"]
    assert all(r["proxy"] == 200 for r in inside.values()), inside  # the model call, through the proxy


def test_the_harness_runs_as_the_tasks_agent_user(inside: dict[str, dict[str, Any]]) -> None:
    assert inside["public"]["uid"] == 65534 and inside["limited"]["uid"] == 0, inside  # [agent].user, else root
