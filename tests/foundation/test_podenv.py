"""The typed pod environment: what the operator's builders write is what the pod programs read back,
a bad variable is a one-line error that names it, and no `TRACEFLEET_*` name is spelled outside
tracefleet.contract.podenv."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from tracefleet.contract import podenv
from tracefleet.operator.plans import job_plans, job_tasks
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


def plans(job: RolloutJob) -> list:
    return job_plans(job, job_tasks(job))


def test_harness_pod_env_reads_back(job: RolloutJob) -> None:
    plan = plans(job)[3]
    pod = harness_pod(job, CFG, plan, attempt=1, secret="tfs_x")
    (harness,) = pod["spec"]["containers"]
    env = HarnessEnv.from_env(_env(harness))
    # the plan arrives whole, equal to the one the operator made (with the pod's attempt)
    assert env.plan == plan.model_copy(update={"attempt": 1})
    assert (env.plan.job, env.plan.index, env.plan.session_id, env.plan.sample_index) == ("demo", 3, "demo-s3", 1)
    assert (env.plan.task.id, env.plan.task.prompt, env.plan.task.setup) == ("t2", "add a test", ["pip install -e ."])
    assert env.plan.harness.command == ["python", "agent.py"] and env.plan.harness.env == {"FOO": "bar"}
    # no preset in the job: the plan's HarnessConfig applies the default (the one place it is)
    assert (env.plan.harness.preset, env.plan.harness.timeout_s, env.plan.model) == ("command", 600, "qwen")
    assert (env.api_key, env.artifacts_dir) == ("tfs_x", "/artifacts")
    assert env.base_url.startswith("http://127.0.0.1:")
    assert _env(harness)["FOO"] == "bar"  # spec.harness.env beside the contract
    (proxy,) = pod["spec"]["initContainers"]
    sidecar = ProxySidecarEnv.from_env(_env(proxy))
    assert sidecar.session_secret == "tfs_x" and sidecar.endpoint == "http://10.0.0.9:8333"


def test_evaluator_and_sealer_env_read_back(job: RolloutJob) -> None:
    planned = plans(job)
    (ev,) = evaluator_job(job, CFG, planned[2])["spec"]["template"]["spec"]["containers"]
    env = EvaluatorEnv.from_env(_env(ev))
    assert (env.bucket, env.endpoint, env.plan) == ("s3://traces/runs", "http://10.0.0.9:8333", planned[2])
    assert (env.plan.evaluator.type, env.plan.evaluator.entrypoint, env.plan.evaluator.timeout_s) == ("python", "grader:score", 300)
    assert env.session_uri == "s3://traces/runs/demo/sessions/2/"
    (seal,) = sealer_job(job, CFG, 4, [planned[3], planned[0], planned[1]])["spec"]["template"]["spec"]["containers"]
    sealer = SealerEnv.from_env(_env(seal))
    assert (sealer.bucket, sealer.endpoint, sealer.job, sealer.batch_seq, sealer.sessions) == (
        "s3://traces/runs", "http://10.0.0.9:8333", "demo", 4, [0, 1, 3])
    # the plans, each task by its id and metadata
    assert [(p.index, p.task.id, p.group_id, p.builder, p.policy_version, p.diagnostics) for p in sealer.plans] == [
        (p.index, p.task.id, p.group_id, "prefix-merge", job.spec.inference.policy_version, None)
        for p in (planned[3], planned[0], planned[1])]
    assert _env(seal)[podenv.SESSIONS] == "0-1,3"


def test_every_written_variable_has_a_reader(job: RolloutJob) -> None:
    """Each variable the builders write is a field of the model its container reads."""
    planned = plans(job)
    pod = harness_pod(job, CFG, planned[0], attempt=0)
    containers = [
        (HarnessEnv, pod["spec"]["containers"][0]),
        (ProxySidecarEnv, pod["spec"]["initContainers"][0]),
        (EvaluatorEnv, evaluator_job(job, CFG, planned[0])["spec"]["template"]["spec"]["containers"][0]),
        (SealerEnv, sealer_job(job, CFG, 1, planned[:2])["spec"]["template"]["spec"]["containers"][0]),
    ]
    for model, container in containers:
        ours = {k for k in _env(container) if k.startswith(podenv.PREFIX)}
        assert ours <= {f.alias for f in model.model_fields.values()}, (model.__name__, ours)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({podenv.PLAN: None}, "TRACEFLEET_PLAN is not set (the operator sets it on the harness container)"),
        ({podenv.PLAN: "{oops"}, "TRACEFLEET_PLAN='{oops' is invalid: "),
        ({podenv.PLAN: '{"index": 0}'}, "TRACEFLEET_PLAN: session_id: Field required (the operator sets it"),
        ({podenv.API_KEY: ""}, "TRACEFLEET_API_KEY is not set"),
    ],
)
def test_a_bad_variable_is_one_line_naming_it(job: RolloutJob, change: dict, message: str) -> None:
    env = _env(harness_pod(job, CFG, plans(job)[0], attempt=0)["spec"]["containers"][0])
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
