"""The proxy sidecar is given the job's proxy plan whole (tracefleet.contract.proxy_plan.SidecarPlan, as files): the
engine time limits and the kind of logprobs its engine reports (a managed vLLM's from the arguments it runs with,
tracefleet's processed_logprobs unless extraArgs override them; an external engine's as the job states it, nothing
when it does not: the proxy then asks the engine) and the job's sampling (spec.inference.sampling), which replaces
the harness's on every call. Its arguments are its place's own: no job changes them."""

from __future__ import annotations

from pathlib import Path

from fixtures.plans import plan_of
from fixtures.pod_reads import child_reads
from tracefleet.contract.podenv import ProxySidecarEnv
from tracefleet.contract.proxy_plan import ProxyPlan
from tracefleet.operator.children.harness import harness_pod
from tracefleet.contract.job import RolloutJob

from fixtures.rolloutjobs import POD_CONFIG, managed_codex_body


def sidecar(tmp: Path, inference: dict | None = None) -> tuple[ProxyPlan, list[str]]:
    """(the proxy plan the sidecar reads, its arguments)."""
    body = managed_codex_body()
    body["spec"]["inference"].update(inference or {})
    body["spec"]["inference"] = {k: v for k, v in body["spec"]["inference"].items() if v is not None}
    job = RolloutJob.model_validate(body)
    child = harness_pod(job, POD_CONFIG, plan_of(job, 0), attempt=0)
    (proxy,) = child.manifest["spec"]["initContainers"]
    return child_reads(ProxySidecarEnv, child, "proxy", tmp).plan.proxy, proxy["args"]


def test_sidecar_gets_the_jobs_engine_limits_and_logprobs_kind(tmp_path: Path) -> None:
    plan, args = sidecar(tmp_path / "a")
    limits = plan.engine_limits
    assert (limits.connect_s, limits.first_token_s, limits.inter_token_s, limits.total_s) == (10, 600, 300, None)
    assert plan.logprobs_mode == "processed_logprobs"  # the managed vLLM runs with it

    plan, changed_args = sidecar(tmp_path / "b", {"engineTimeouts": {"interTokenSeconds": 45, "totalSeconds": 7200.5},
                                                  "managed": {"model": "m", "extraArgs": ["--logprobs-mode=raw_logprobs"]}})
    assert (plan.engine_limits.inter_token_s, plan.engine_limits.total_s) == (45, 7200.5)
    assert plan.logprobs_mode == "raw_logprobs"  # extraArgs come last: vLLM runs with what they say
    # no job-derived flag: the arguments are the sidecar's place's (where it listens, its folders), whatever the job
    assert changed_args == args == ["proxy", "--in-pod", "--host", "0.0.0.0", "--port", "8100", "--capture-dir",
                                    "/capture", "--artifacts-dir", "/artifacts"]

    external = {"managed": None, "external": {"baseUrl": "http://10.1.2.3:8000"}}
    assert sidecar(tmp_path / "c", external)[0].logprobs_mode is None  # unstated: the proxy asks the engine
    external["external"]["logprobsMode"] = "processed_logprobs"
    assert sidecar(tmp_path / "d", external)[0].logprobs_mode == "processed_logprobs"


def test_sidecar_samples_as_the_job_says(tmp_path: Path) -> None:
    plan, _ = sidecar(tmp_path / "a")
    assert plan.sampling.fields() == {}  # the harness's own, else the engine's
    plan, args = sidecar(tmp_path / "b", {"sampling": {"temperature": 0.7, "topP": 0.95, "topK": 20}})
    assert plan.sampling.fields() == {"temperature": 0.7, "top_p": 0.95, "top_k": 20}
    assert "--temperature" not in args
