"""The typed pod environment: what the operator's builders write is what the pod programs read back,
a bad variable is a one-line error that names it, and no `TRACEFLEET_*` name is spelled outside
tracefleet.contract.podenv."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from tracefleet.contract import podenv
from tracefleet.contract.semantics import session_plan
from tracefleet.contract.session import HarnessConfig
from tracefleet.operator.children.harness import harness_pod
from tracefleet.operator.children.jobs import evaluator_job, sealer_job
from tracefleet.contract.job import RolloutJob
from tracefleet.operator.config import OperatorConfig
from tracefleet.contract.podenv import EvaluatorEnv, HarnessEnv, PodEnvError, ProxySidecarEnv, SealerEnv

REPO = Path(__file__).resolve().parents[2]

JOB = """
apiVersion: tracefleet.io/v1alpha1
kind: RolloutJob
metadata: {name: demo, namespace: team, uid: u-1, generation: 1}
spec:
  inference: {external: {baseUrl: "http://10.1.2.3:8000", model: qwen}}
  harness:
    command: ["python", "agent.py"]
    image: ghcr.io/acme/agent:1
    sessionTimeoutSeconds: 600
    workspace: {setup: ["pip install -e ."]}
    env: {FOO: bar}
  tasks:
    inline: [{id: t1, prompt: "fix the bug"}, {id: t2, prompt: "add a test"}]
    samplesPerTask: 2
  evaluator: {preset: hook, entryPoint: "grader:score", timeoutSeconds: 300}
  output: {uri: "s3://traces/runs", credentialsSecretRef: {name: creds}}
"""


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


CFG = OperatorConfig(bucket_endpoint="http://10.0.0.9:8333")


@pytest.fixture
def job() -> RolloutJob:
    return RolloutJob.model_validate(yaml.safe_load(JOB))


def test_harness_pod_env_reads_back(job: RolloutJob) -> None:
    pod = harness_pod(job, CFG, session=3, attempt=1, secret="tfs_x")
    (harness,) = pod["spec"]["containers"]
    env = HarnessEnv.from_env(_env(harness))
    assert (env.job, env.session, env.session_id, env.task_index, env.sample_index) == ("demo", 3, "demo-s3", 1, 1)
    assert env.task_json == {"id": "t2", "prompt": "add a test"}
    assert env.command == ["python", "agent.py"] and env.workspace_setup == ["pip install -e ."]
    assert (env.api_key, env.preset, env.timeout_s, env.artifacts_dir) == ("tfs_x", None, 600, "/artifacts")
    # no preset in the job: left unset, the pod program's HarnessConfig applies the default (the one place it is)
    assert HarnessConfig(preset=env.preset).preset == "command"
    assert env.base_url.startswith("http://127.0.0.1:")
    assert _env(harness)["FOO"] == "bar"  # spec.harness.env beside the contract
    (proxy,) = pod["spec"]["initContainers"]
    sidecar = ProxySidecarEnv.from_env(_env(proxy))
    assert sidecar.session_secret == "tfs_x" and sidecar.endpoint == "http://10.0.0.9:8333"


def test_evaluator_and_sealer_env_read_back(job: RolloutJob) -> None:
    (ev,) = evaluator_job(job, CFG, 2)["spec"]["template"]["spec"]["containers"]
    env = EvaluatorEnv.from_env(_env(ev))
    assert (env.bucket, env.endpoint, env.job, env.session, env.task_index, env.sample_index) == (
        "s3://traces/runs", "http://10.0.0.9:8333", "demo", 2, 1, 0)
    assert (env.evaluator, env.entrypoint, env.command, env.timeout_s) == ("hook", "grader:score", None, 300)
    assert env.task_json == {"id": "t2", "prompt": "add a test"}
    assert env.session_uri == "s3://traces/runs/demo/sessions/2/"
    plan = session_plan("demo", ["t1", "t2"], 2)
    (seal,) = sealer_job(job, CFG, 4, [plan[3], plan[0], plan[1]])["spec"]["template"]["spec"]["containers"]
    sealer = SealerEnv.from_env(_env(seal))
    assert (sealer.bucket, sealer.endpoint, sealer.job, sealer.batch_seq, sealer.sessions, sealer.builder) == (
        "s3://traces/runs", "http://10.0.0.9:8333", "demo", 4, [0, 1, 3], "prefix-merge")
    assert sorted(sealer.planned_sessions(), key=lambda p: p.index) == [plan[0], plan[1], plan[3]]
    assert sealer.policy_version == job.spec.inference.policy_version and sealer.diagnostics is None
    assert _env(seal)[podenv.SESSIONS] == "0-1,3"


def test_every_written_variable_has_a_reader(job: RolloutJob) -> None:
    """Each variable the builders write is a field of the model its container reads."""
    pod = harness_pod(job, CFG, session=0, attempt=0)
    containers = [
        (HarnessEnv, pod["spec"]["containers"][0]),
        (ProxySidecarEnv, pod["spec"]["initContainers"][0]),
        (EvaluatorEnv, evaluator_job(job, CFG, 0)["spec"]["template"]["spec"]["containers"][0]),
        (SealerEnv, sealer_job(job, CFG, 1, session_plan("demo", ["t1"], 1))["spec"]["template"]["spec"]["containers"][0]),
    ]
    for model, container in containers:
        ours = {k for k in _env(container) if k.startswith(podenv.PREFIX)}
        assert ours <= {f.alias for f in model.model_fields.values()}, (model.__name__, ours)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({podenv.JOB: None}, "TRACEFLEET_JOB is not set (the operator sets it on the harness container)"),
        ({podenv.SESSION: "x"}, "TRACEFLEET_SESSION='x' is invalid: "),
        ({podenv.COMMAND_JSON: "[oops"}, "TRACEFLEET_COMMAND_JSON='[oops' is invalid: "),
        ({podenv.TASK_JSON: None}, "no task: set TRACEFLEET_TASK_JSON, TRACEFLEET_TASKS_FILE or TRACEFLEET_TASKS_URI"),
        ({podenv.TIMEOUT_S: ""}, "TRACEFLEET_TIMEOUT_S is not set"),
    ],
)
def test_a_bad_variable_is_one_line_naming_it(job: RolloutJob, change: dict, message: str) -> None:
    env = _env(harness_pod(job, CFG, session=0, attempt=0)["spec"]["containers"][0])
    for k, v in change.items():
        env.pop(k) if v is None else env.__setitem__(k, v)
    with pytest.raises(PodEnvError) as err:
        HarnessEnv.from_env(env)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


# Where every `TRACEFLEET_*` string must come from tracefleet.contract.podenv (folders or files): the writer
# (the operator's child builders) and the pod programs that read it.
CHECKED = ("operator", "runner/pod")
# Names that stay where they are, and why (keep this short).
ALLOWED = {
    # the operator process's own settings (its Deployment's env), not what it writes into pods
    "operator/cli.py": {"TRACEFLEET_PROXY_IMAGE", "TRACEFLEET_EVALUATOR_IMAGE"},
}


def _string_literals(tree: ast.AST) -> list[tuple[int, str]]:
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_pod_env_name_is_spelled_outside_podenv() -> None:
    found = []
    for root in map(REPO.joinpath, CHECKED):
        for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            for line, text in _string_literals(ast.parse(path.read_text(), str(path))):
                if podenv.PREFIX in text and text not in ALLOWED.get(rel, set()):
                    found.append(f"{rel}:{line}: {text!r}")
    assert not found, "use the constants of tracefleet.contract.podenv:\n" + "\n".join(sorted(found))
