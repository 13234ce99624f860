"""The typed pod environment: what the operator's builders write is what the pod programs read back,
a bad variable is a one-line error that names it, and no `TRACEFLEET_*` name is spelled outside
tracefleet.contract.podenv."""

from __future__ import annotations

import ast
import json
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
from fixtures.pod_reads import child_reads, pod_inputs

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


def test_harness_pod_env_reads_back(job: RolloutJob, tmp_path: Path) -> None:
    plan = plans(job)[3]
    child = harness_pod(job, CFG, plan, attempt=1, secret="tfs_x")
    pod = child.manifest
    (harness,) = pod["spec"]["containers"]
    env = child_reads(HarnessEnv, child, "harness", tmp_path)
    # the plan arrives whole, equal to the one the operator made (with the pod's attempt)
    assert env.plan == plan.model_copy(update={"attempt": 1})
    assert (env.plan.job, env.plan.index, env.plan.session_id, env.plan.sample_index) == ("demo", 3, "demo-s3", 1)
    assert (env.plan.task.id, env.plan.task.prompt, env.plan.task.setup) == ("t2", "add a test", ["pip install -e ."])
    assert env.plan.harness.command == ["python", "agent.py"] and env.plan.harness.env == {"FOO": "bar"}
    # no preset in the job: the plan's HarnessConfig applies the default (the one place it is)
    assert (env.plan.harness.preset, env.plan.harness.timeout_s, env.plan.model) == ("command", 600, "qwen")
    assert (env.api_key, _env(harness)[podenv.ARTIFACTS_DIR]) == ("tfs_x", "/artifacts")
    assert env.base_url.startswith("http://127.0.0.1:")
    assert _env(harness)["FOO"] == "bar"  # spec.harness.env beside the contract
    sidecar = child_reads(ProxySidecarEnv, child, "proxy", tmp_path / "proxy")
    assert sidecar.session_secret == "tfs_x" and sidecar.endpoint == "http://10.0.0.9:8333"
    assert (sidecar.plan.session_id, sidecar.plan.proxy.served_model) == ("demo-s3", "qwen")


def test_evaluator_and_sealer_env_read_back(job: RolloutJob, tmp_path: Path) -> None:
    planned = plans(job)
    env = child_reads(EvaluatorEnv, evaluator_job(job, CFG, planned[2]), "evaluator", tmp_path / "evaluator")
    assert (env.bucket, env.endpoint, env.plan) == ("s3://traces/runs", "http://10.0.0.9:8333", planned[2])
    assert (env.plan.evaluator.type, env.plan.evaluator.entrypoint, env.plan.evaluator.timeout_s) == ("python", "grader:score", 300)
    assert env.session_uri == "s3://traces/runs/demo/sessions/2/"
    sealer_child = sealer_job(job, CFG, 4, [planned[3], planned[0], planned[1]])
    (seal,) = sealer_child.manifest["spec"]["template"]["spec"]["containers"]
    sealer = child_reads(SealerEnv, sealer_child, "sealer", tmp_path / "sealer")
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
    pod = harness_pod(job, CFG, planned[0], attempt=0).manifest
    containers = [
        (HarnessEnv, pod["spec"]["containers"][0]),
        (ProxySidecarEnv, pod["spec"]["initContainers"][0]),
        (EvaluatorEnv, evaluator_job(job, CFG, planned[0]).manifest["spec"]["template"]["spec"]["containers"][0]),
        (SealerEnv, sealer_job(job, CFG, 1, planned[:2]).manifest["spec"]["template"]["spec"]["containers"][0]),
    ]
    for model, container in containers:
        ours = {k for k in _env(container) if k.startswith(podenv.PREFIX)}
        assert ours <= {f.alias for f in model.model_fields.values()}, (model.__name__, ours)


@pytest.mark.parametrize(
    ("plan", "change", "message"),
    [
        (None, {}, "TRACEFLEET_PLAN_DIR={dir}: the plan cannot be read: no session-plan.NNNN file in {dir} (the "
                   "operator mounts it on the harness container)"),
        ("{oops", {}, "the plan in {dir}: Expecting property name enclosed in double quotes"),
        ('{"index": 0}', {}, "the plan in {dir}: session_id: Field required (the operator sets it"),
        ("", {podenv.API_KEY: ""}, "TRACEFLEET_API_KEY is not set"),
    ],
)
def test_a_bad_variable_or_plan_is_one_line_naming_it(job: RolloutJob, tmp_path: Path, plan: str | None, change: dict,
                                                      message: str) -> None:
    env = pod_inputs(HarnessEnv(plan=plans(job)[0], base_url="http://127.0.0.1:1", api_key="k"), tmp_path)
    if plan is not None:
        (tmp_path / "session-plan.0000").write_text(plan or (tmp_path / "session-plan.0000").read_text())
    else:
        (tmp_path / "session-plan.0000").unlink()
    for k, v in change.items():
        env[k] = v
    with pytest.raises(PodEnvError) as err:
        HarnessEnv.from_env(env)
    assert str(err.value).startswith(message.format(dir=tmp_path)) and "\n" not in str(err.value)


@pytest.mark.parametrize("size", ["prompt", "samples"])
def test_plans_at_the_schemas_most_reach_their_programs(job: RolloutJob, tmp_path: Path, size: str) -> None:
    """A prompt of the schema's most characters (each 4 UTF-8 bytes: over 1 MiB, more than a ConfigMap holds) and a
    sealer of a group of the schema's most samples per task: every plan arrives whole, in ConfigMaps the API server
    accepts (at most 1 MiB of data each), where one environment variable (Linux: at most 128 KiB) could not."""
    body = yaml.safe_load(JOB)
    if size == "prompt":
        body["spec"]["tasks"]["inline"][0]["prompt"] = "\U0001F600" * 262144
    else:
        body["spec"]["tasks"]["samplesPerTask"] = 1024
    big = RolloutJob.model_validate(body)
    planned = plans(big)
    children = ([harness_pod(big, CFG, planned[0], attempt=0), evaluator_job(big, CFG, planned[0])] if size == "prompt"
                else [sealer_job(big, CFG, 1, planned[:1024])])
    for i, child in enumerate(children):
        sizes = [sum(len(v.encode()) for v in cm["data"].values()) for cm in child.config_maps]
        assert all(s <= 1024 * 1024 for s in sizes), sizes
        if size == "prompt":
            assert len(sizes) > 1  # split over several
            model, program = (HarnessEnv, "harness") if i == 0 else (EvaluatorEnv, "evaluator")
            assert child_reads(model, child, program, tmp_path / str(i)).plan.task.prompt == "\U0001F600" * 262144
        else:
            assert len(child_reads(SealerEnv, child, "sealer", tmp_path / str(i)).plans) == 1024


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


def test_a_plan_from_a_newer_operator_is_refused_by_name(job: RolloutJob, tmp_path: Path) -> None:
    """Plans ship with every default written out (an image with other defaults runs what was planned), and a field
    this image does not know is refused in one line, never dropped: the operator and its images disagree."""
    env = pod_inputs(HarnessEnv(plan=plans(job)[0], base_url="http://127.0.0.1:1", api_key="k"), tmp_path)
    shipped = json.loads((tmp_path / "session-plan.0000").read_text())
    assert shipped["setup_timeout_s"] == 600 and shipped["attempt"] == 0  # defaults included
    (tmp_path / "session-plan.0000").write_text(json.dumps({**shipped, "sandbox_profile": "strict"}))
    with pytest.raises(PodEnvError) as err:
        HarnessEnv.from_env(env)
    assert str(err.value).startswith(f"the plan in {tmp_path}: sandbox_profile: not in this image's SessionPlan")
    assert "\n" not in str(err.value)


def test_a_harness_pod_refuses_a_guided_plan(job: RolloutJob, tmp_path: Path) -> None:
    """A pod's proxy sidecar has no guide engine (tracefleet.trainer.guide runs on the local driver): a plan that
    guides its first calls fails at registration with the reason, never runs unguided as if it were guided."""
    from tracefleet.runner.pod.harness_pod import PodPlace
    from tracefleet.runner.session import StageFailed

    plan = plans(job)[0].model_copy(update={"guided_calls": 1})
    env = pod_inputs(HarnessEnv(plan=plan, base_url="http://127.0.0.1:1", api_key="k"), tmp_path)
    place = PodPlace(env)
    assert place.plan.guided_calls == 1  # the field travels in the pod's plan
    with pytest.raises(StageFailed, match="has no guide engine") as err:
        place.connect(place.plan, deadline=0.0)
    assert err.value.stage == "register"
