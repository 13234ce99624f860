"""The proxy sidecar is told the job's engine time limits and the kind of logprobs its engine reports: a managed
vLLM's from the arguments it runs with (tracefleet's processed_logprobs unless extraArgs override them), an
external engine's as the job states it, nothing when it does not (the proxy then asks the engine); and the job's
sampling (spec.inference.sampling), which replaces the harness's on every call."""

from __future__ import annotations

import argparse

from fixtures.plans import plan_of
from tracefleet.operator.children.harness import harness_pod
from tracefleet.contract.job import RolloutJob
from tracefleet.proxy.cli import configure, engine_limits

from fixtures.rolloutjobs import POD_CONFIG, managed_codex_body


def sidecar_args(inference: dict | None = None) -> argparse.Namespace:
    body = managed_codex_body()
    body["spec"]["inference"].update(inference or {})
    body["spec"]["inference"] = {k: v for k, v in body["spec"]["inference"].items() if v is not None}
    (proxy,) = harness_pod(RolloutJob.model_validate(body), POD_CONFIG, plan_of(RolloutJob.model_validate(body), 0), attempt=0)["spec"]["initContainers"]
    parser = argparse.ArgumentParser()
    configure(parser)  # what `tracefleet proxy` makes of them
    assert proxy["args"][0] == "proxy"
    return parser.parse_args(proxy["args"][1:])


def test_sidecar_gets_the_jobs_engine_limits_and_logprobs_kind() -> None:
    args = sidecar_args()
    limits = engine_limits(args)
    assert (limits.connect_s, limits.first_token_s, limits.inter_token_s, limits.total_s) == (10, 600, 300, None)
    assert args.logprobs_mode == "processed_logprobs"  # the managed vLLM runs with it

    args = sidecar_args({"engineTimeouts": {"interTokenSeconds": 45, "totalSeconds": 7200.5},
                         "managed": {"model": "m", "extraArgs": ["--logprobs-mode=raw_logprobs"]}})
    assert (engine_limits(args).inter_token_s, engine_limits(args).total_s) == (45, 7200.5)
    assert args.logprobs_mode == "raw_logprobs"  # extraArgs come last: vLLM runs with what they say

    external = {"managed": None, "external": {"baseUrl": "http://10.1.2.3:8000"}}
    assert sidecar_args(external).logprobs_mode is None  # unstated: the proxy asks the engine
    external["external"]["logprobsMode"] = "processed_logprobs"
    assert sidecar_args(external).logprobs_mode == "processed_logprobs"


def test_sidecar_samples_as_the_job_says() -> None:
    args = sidecar_args()
    assert (args.temperature, args.top_p, args.top_k) == (None, None, None)  # the harness's own, else the engine's
    args = sidecar_args({"sampling": {"temperature": 0.7, "topP": 0.95, "topK": 20}})
    assert (args.temperature, args.top_p, args.top_k) == (0.7, 0.95, 20)
