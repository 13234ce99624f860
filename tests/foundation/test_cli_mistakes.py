"""Every mistake a user can make at the command line ends in one line naming the problem, no traceback,
and exit status 2 (`tracefleet validate` keeps its documented status 1 for a file with problems).

Each row is a mistake as a newcomer makes it, run as they run it (the console script in a subprocess),
against small real inputs: a job file, a sealed batch in a directory bucket, a capture log.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

from tracefleet.bucket import LocalBucket
from tracefleet.traces import Sealer, SessionInfo, build_traces
from tracefleet.traces.synthetic import SyntheticSession

REPO = Path(__file__).resolve().parents[2]
NO_CLUSTER = (("KUBECONFIG", "/nonexistent/kubeconfig"),)  # and not in a pod (no KUBERNETES_SERVICE_HOST)
TRACEFLEET = [sys.executable, "-m", "tracefleet"]


@dataclass(frozen=True)
class World:
    """What the mistakes are made against, all under one temporary directory."""

    root: Path
    job: Path  # a valid local job (command harness, a task with a local repo)
    bucket: Path  # a directory bucket holding job `seen` with batch 0
    capture: Path  # a capture log with two calls (one trace)

    def job_with(self, mutate: Callable[[dict], None], name: str = "bad.yaml") -> Path:
        data = yaml.safe_load(self.job.read_text())
        mutate(data)
        path = self.root / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def file(self, name: str, content: str | bytes) -> Path:
        path = self.root / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("mistakes")
    shutil.copytree(REPO / "examples" / "quickstart" / "tasks" / "calc", root / "tasks" / "calc")
    job = root / "job.yaml"
    job.write_text(yaml.safe_dump({
        "apiVersion": "tracefleet.io/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": "mistakes"},
        "spec": {
            "inference": {"external": {"baseUrl": "http://127.0.0.1:9"}},
            "harness": {"preset": "command", "command": ["python", "-c", "pass"]},
            "tasks": {"samplesPerTask": 2, "inline": [
                {"id": "calc", "prompt": "fix add", "workspace": {"repo": "tasks/calc"}}]},
            "output": {"uri": "./out"},
        },
    }, sort_keys=False))
    capture = root / "capture" / "sess-1.jsonl"
    capture.parent.mkdir()
    s = SyntheticSession(capture, "sess-1")
    first = s.call(s.tokens(20), 4)
    s.call(s.extend(first, s.tokens(3)), 4, parent=first)
    s.close()
    result = build_traces(capture, session=SessionInfo(job="seen", reward=1.0, group_id="g"))
    Sealer(LocalBucket(root / "bucket"), "seen", spool=root / "spool").seal(result.traces)
    return World(root, job, root / "bucket", capture)


def _set(path: str, value: object) -> Callable[[dict], None]:
    def apply(data: dict) -> None:
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value

    return apply


@dataclass(frozen=True)
class Mistake:
    id: str
    argv: Callable[[World], list[str]]
    says: list[str]  # fragments the one line must hold
    status: int = 2
    env: tuple[tuple[str, str], ...] = ()  # set for the command


MISTAKES: list[Mistake] = [
    # ---- tracefleet run: the job file
    Mistake("run-a-python-file", lambda w: ["run", str(REPO / "examples" / "quickstart" / "agent.py")], ["agent.py: "]),
    Mistake("run-a-binary-file", lambda w: ["run", str(w.file("model.bin", b"\x89PNG\x00\xff\xfe"))], ["not a text file"]),
    Mistake("run-a-text-file", lambda w: ["run", str(w.file("notes.txt", "remember to run the job\n"))],
            ["expected a mapping (a RolloutJob manifest), got str"]),
    Mistake("run-a-directory", lambda w: ["run", str(w.root)], ["is a directory", "job.yaml"]),
    Mistake("run-a-missing-file", lambda w: ["run", str(w.root / "jbo.yaml")], ["jbo.yaml: no such file"]),
    Mistake("run-without-a-file", lambda w: ["run"], ["JOB.yaml is required"]),
    Mistake("run-typo-in-a-field",
            lambda w: ["run", str(w.job_with(lambda d: d["spec"]["tasks"].update(samplesPerTsk=2)))],
            ["spec.tasks.samplesPerTsk: unknown field (did you mean samplesPerTask?)"]),
    Mistake("run-unknown-preset", lambda w: ["run", str(w.job_with(_set("spec.harness.preset", "codx")))],
            ["spec.harness.preset: ", "'codx'", "did you mean 'codex'?"]),
    Mistake("run-zero-samples", lambda w: ["run", str(w.job_with(_set("spec.tasks.samplesPerTask", 0)))],
            ["spec.tasks.samplesPerTask: ", "greater than or equal to 1", "got 0"]),
    Mistake("run-missing-task-repo",
            lambda w: ["run", str(w.job_with(_set("spec.tasks.inline", [
                {"id": "t", "prompt": "p", "workspace": {"repo": "tasks/nope"}}])))],
            ["spec.tasks.inline[0].workspace.repo: tasks/nope: no such file or directory"]),
    Mistake("run-missing-tasks-file",
            lambda w: ["run", str(w.job_with(lambda d: d["spec"].update(tasks={"uri": "tasks.jsonl"})))],
            ["spec.tasks.uri: tasks.jsonl: no such file or directory"]),
    Mistake("run-a-kubernetes-deployment",
            lambda w: ["run", str(w.file("deploy.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {}\n"))],
            ["kind: 'Deployment' is not a RolloutJob", "tracefleet.io/v1alpha1"]),
    Mistake("run-two-jobs-in-one-file",
            lambda w: ["run", str(w.file("two.yaml", w.job.read_text() + "---\n" + w.job.read_text()))],
            ["holds 2 YAML documents"]),
    Mistake("run-bad-accept", lambda w: ["run", str(w.job), "--accept", "rewrd>=1"], ["--accept 'rewrd>=1'", "reward>=1"]),
    Mistake("run-zero-parallelism", lambda w: ["run", str(w.job), "-j", "0"], ["-j", "at least 1", "got 0"]),
    Mistake("run-not-a-number", lambda w: ["run", str(w.job), "-j", "two"], ["-j", "'two'"]),
    Mistake("run-a-gpu-model-here",
            lambda w: ["run", str(w.job_with(_set("spec.inference", {"managed": {"model": "Qwen/Qwen3-4B"}}))),
                       "--work-dir", str(w.root / "work")],
            ["'Qwen/Qwen3-4B' needs a GPU", "--engine-url"]),
    # ---- tracefleet traces
    Mistake("traces-ls-a-missing-capture-log", lambda w: ["traces", "ls", str(w.root / "sess-9.jsonl")],
            ["sess-9.jsonl: no such capture log"]),
    Mistake("traces-show-a-missing-capture-log", lambda w: ["traces", "show", str(w.root / "sess-9.jsonl")],
            ["sess-9.jsonl: no such capture log"]),
    Mistake("traces-show-a-tasks-file", lambda w: ["traces", "show", str(w.file("tasks.jsonl", '{"id": "t", "prompt": "p"}\n'))],
            ["tasks.jsonl: no capture records"]),
    Mistake("traces-show-a-job-file", lambda w: ["traces", "show", str(w.job)],
            ["job.yaml is a file, not a bucket", "capture log (.jsonl)"]),
    Mistake("traces-ls-a-missing-bucket", lambda w: ["traces", "ls", str(w.root / "nope")], ["does not exist"]),
    Mistake("traces-show-an-unknown-job", lambda w: ["traces", "show", str(w.bucket), "--job", "sen"],
            ["no sealed batches for job 'sen'", "jobs there: seen"]),
    Mistake("traces-show-a-batch-not-sealed", lambda w: ["traces", "show", str(w.bucket), "--batch", "7"],
            ["--batch 7", "sealed: 0"]),
    Mistake("traces-show-a-trace-out-of-range", lambda w: ["traces", "show", str(w.bucket), "--trace", "5"],
            ["--trace 5", "has 1 traces"]),
    Mistake("traces-show-a-missing-tokenizer-file",
            lambda w: ["traces", "show", str(w.capture), "--tokenizer", str(w.root / "tokenizer.json")],
            ["--tokenizer", "tokenizer.json: no such file"]),
    Mistake("traces-show-an-unknown-tokenizer", lambda w: ["traces", "show", str(w.capture), "--tokenizer", "llama-9"],
            ["--tokenizer llama-9: ", "'llama-9'"]),
    Mistake("traces-export-without-out", lambda w: ["traces", "export", str(w.bucket)], ["--out"]),
    Mistake("traces-unknown-action", lambda w: ["traces", "cat", str(w.bucket)], ["invalid choice: 'cat'"]),
    Mistake("unknown-subcommand", lambda w: ["trace", "ls", str(w.bucket)], ["invalid choice: 'trace'"]),
    # ---- a cluster that is not there, a store the URI cannot name
    Mistake("operator-without-a-cluster", lambda w: ["operator", "--metrics-port", "0", "--liveness-port", "0"],
            ["no Kubernetes cluster to talk to", "kubeconfig"], env=NO_CLUSTER),
    Mistake("dashboard-kubernetes-without-a-cluster", lambda w: ["dashboard", str(w.bucket), "--kubernetes", "--port", "0"],
            ["no Kubernetes cluster to talk to"], env=NO_CLUSTER),
    Mistake("dashboard-a-bad-s3-uri", lambda w: ["dashboard", "s3:/bad", "--port", "0"], ["s3://bucket/prefix"]),
    # ---- tracefleet validate: a file with problems is its result, exit status 1 (documented)
    Mistake("validate-missing-task-repo",
            lambda w: ["validate", str(w.job_with(_set("spec.tasks.inline", [
                {"id": "t", "prompt": "p", "workspace": {"repo": "tasks/nope"}}]), name="v.yaml"))],
            ["v.yaml: spec.tasks.inline[0].workspace.repo: tasks/nope: no such file or directory"], status=1),
    Mistake("validate-a-metadata-typo", lambda w: ["validate", str(w.job_with(_set("metadata.lables", {"team": "rl"}), name="v3.yaml"))],
            ["v3.yaml: metadata.lables: unknown field (did you mean labels?)"], status=1),
    Mistake("validate-a-bad-label-value",
            lambda w: ["validate", str(w.job_with(_set("metadata.labels", {"team": "Bad Value!"}), name="v4.yaml"))],
            ["v4.yaml: metadata.labels: ", "'Bad Value!'", "at most 63 characters"], status=1),
    Mistake("validate-a-bad-annotation-key",
            lambda w: ["validate", str(w.job_with(_set("metadata.annotations", {"has space": "x"}), name="v5.yaml"))],
            ["v5.yaml: metadata.annotations: invalid annotation key 'has space'"], status=1),
    Mistake("validate-a-missing-agent-script",
            lambda w: ["validate", str(w.job_with(_set("spec.harness.command", ["python", "agent.py"]), name="v6.yaml"))],
            ["v6.yaml: spec.harness.command: the script 'agent.py' is not in every session's working directory"], status=1),
    Mistake("validate-unknown-preset",
            lambda w: ["validate", str(w.job_with(_set("spec.harness.preset", "claude"), name="v2.yaml"))],
            ["v2.yaml: spec.harness.preset: ", "'claude'", "did you mean 'claude-code'?"], status=1),
]


def test_table_is_broad() -> None:
    assert len(MISTAKES) >= 15 and len({m.id for m in MISTAKES}) == len(MISTAKES)
    assert {m.id.split("-")[0] for m in MISTAKES} >= {"run", "traces", "validate"}


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.id for m in MISTAKES])
def test_a_mistake_is_one_line(world: World, mistake: Mistake) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"} | dict(mistake.env)
    proc = subprocess.run([*TRACEFLEET, *mistake.argv(world)], capture_output=True, text=True, timeout=120, cwd=world.root,
                          env=env)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode == mistake.status, (proc.returncode, lines)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, lines
    for fragment in mistake.says:
        assert fragment in lines[0], (fragment, lines[0])
