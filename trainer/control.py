"""Update a running job's policy: the trainer calls the engine(s), never the proxies.

`update_policy(engines, weights, version)` runs one weight sync over every engine replica in lockstep:

1. **pause**: vLLM `/pause?mode=keep` freezes the requests in flight (vLLM >= 0.17); they continue under the
   new weights on resume and lose nothing. An engine without keep mode is paused with `abort` (its requests
   end with finish_reason "abort", which the proxy reports to the harness as a retryable error), `wait`
   when asked (they finish under the old weights first).
2. **load**: the new weights, in place, from a checkpoint directory the engine can read (vLLM
   `/collective_rpc` `reload_weights`, the route that works on the CPU build; a directory holding only the
   changed tensors is enough). On a cluster the directory is on a volume the inference pods mount.
3. **version**: vLLM's weight-version label (`/update_weight_version`) becomes `VERSION@TIME ...`
   (tracefleet.contract.policy): the proxies read it from the engine (one `/weight_info` per call, shared
   between concurrent calls) and split each call's tokens by version without being called.
4. **reset_cache**: the prefix cache holds KV computed by the old weights; it is dropped (best effort:
   vLLM refuses while kept requests hold blocks, which is reported, not fatal).
5. **resume**: `GUARD_S` after the label's time, so that no new-weights token can reach a proxy before it.

The engines are resumed whatever failed, except once a load has begun and not every engine holds the new
weights with their label: measured on vLLM 0.32's CPU build, a failed in-place reload leaves the model's
parameters on the meta device and the next generation step kills the engine, and an engine that loaded but
was not labelled would sample under a wrong version. Those are left paused (`left_paused`; requests wait),
for an update with a good checkpoint to finish. The weights directory is checked first where the trainer sees
it. The report (tracefleet.contract.policy.PolicyUpdateReport)
says what each step did on each engine and how long it took, and what became of the requests in flight
(counted from the engine's own gauges: before an abort or wait pause, after a keep one). These routes need
`VLLM_SERVER_DEV_MODE=1` on vLLM >= 0.24 (tracefleet.vllm sets it for every vLLM it starts).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from tracefleet.contract.policy import (InFlight, PauseMode, PolicyUpdateReport, StepName, StepReport, VersionMark,
                                        decode_label, encode_label, label_version)
from tracefleet.vllm import version_tuple

KEEP_SINCE = (0, 17)  # first vLLM whose /pause takes mode=keep
# Between the label's time and the resume: a new-weights token reaches a proxy at least this long after the
# mark, so the proxy's split stays exact under this much clock skew (cluster nodes: NTP, milliseconds).
GUARD_S = 0.05
RUNNING_GAUGE = "vllm:num_requests_running"
WAITING_GAUGE = "vllm:num_requests_waiting"
DEV_MODE_HINT = "vLLM >= 0.24 serves it only with VLLM_SERVER_DEV_MODE=1"
WEIGHT_FILES = ("safetensors", "bin", "pt")  # what vLLM's default loader reads from a directory


class PolicyUpdateFailed(RuntimeError):
    """A step failed on some engine (the engines were resumed); `.report` says which and what it answered."""

    def __init__(self, report: PolicyUpdateReport) -> None:
        failed = [s for s in report.steps if not s.ok and s.step != "reset_cache"]
        why = "; ".join(f"{s.step} on {s.engine}: {s.detail}" for s in failed) or "policy update failed"
        if report.left_paused:
            why += ("; the engines are left paused (their weights are not the labelled ones): run the update "
                    "again with a good checkpoint")
        super().__init__(why)
        self.report = report


class EngineControl:
    """One engine replica's pause, weight and version routes (vLLM's), over HTTP."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        headers = {"authorization": f"Bearer {api_key}"} if api_key else None
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        r = self.http.request(method, path, **kw)
        if r.status_code == 404:
            raise RuntimeError(f"{self.url} has no {path.split('?')[0]} ({DEV_MODE_HINT})")
        if r.status_code >= 400:
            raise RuntimeError(f"{path} answered {r.status_code}: {r.text[:300]}")
        return r.json() if r.content else None

    def version(self) -> str | None:
        try:
            return str(self._call("GET", "/version").get("version"))
        except (RuntimeError, httpx.HTTPError, AttributeError):
            return None

    def pause_modes(self) -> tuple[PauseMode, ...]:
        """The pause modes this engine has (by its vLLM version)."""
        v = version_tuple(self.version() or "")
        return ("keep", "abort", "wait") if v and v >= KEEP_SINCE else ("abort",)

    def pause(self, mode: PauseMode) -> Any:
        return self._call("POST", "/pause", params={"mode": mode})

    def resume(self) -> Any:
        return self._call("POST", "/resume")

    def is_paused(self) -> bool:
        return bool(self._call("GET", "/is_paused").get("is_paused"))

    def reload(self, weights: str) -> Any:
        return self._call("POST", "/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": weights}})

    def label(self) -> str:
        return str(self._call("GET", "/weight_info").get("weight_version"))

    def set_label(self, label: str) -> Any:
        return self._call("POST", "/update_weight_version", json={"new_version": label})

    def reset_prefix_cache(self) -> bool:
        r = self.http.post("/reset_prefix_cache")
        if r.status_code >= 400:
            raise RuntimeError(f"/reset_prefix_cache answered {r.status_code}: {r.text[:200]}")
        data = r.json() if r.content else {}
        return bool(data.get("success", True)) if isinstance(data, dict) else True

    def requests(self) -> tuple[int, int]:
        """(running, waiting): the engine's own gauges, summed over its labels ((0, 0) when unreadable: the
        pause that follows says what is wrong)."""
        running = waiting = 0.0
        try:
            text = self.http.get("/metrics").text
        except httpx.HTTPError:
            return 0, 0
        for line in text.splitlines():
            name, _, rest = line.partition("{")
            if name in (RUNNING_GAUGE, WAITING_GAUGE):
                value = float(rest.rsplit(" ", 1)[-1])
                if name == RUNNING_GAUGE:
                    running += value
                else:
                    waiting += value
        return int(running), int(waiting)


def _step(report: PolicyUpdateReport, step: StepName, engine: EngineControl, fn: Any) -> Any:
    t0 = time.monotonic()
    try:
        out = fn()
    except (RuntimeError, httpx.HTTPError) as exc:
        report.steps.append(StepReport(step=step, engine=engine.url, seconds=time.monotonic() - t0, ok=False,
                                       detail=f"{type(exc).__name__}: {exc}"))
        return None
    detail = out if isinstance(out, str) else None if out is None else str(out)[:300]
    report.steps.append(StepReport(step=step, engine=engine.url, seconds=time.monotonic() - t0, detail=detail))
    return out if out is not None else True


def check_weights(weights: str | Path) -> None:
    """ValueError unless `weights` is a directory holding weight files (a failed load breaks the engine)."""
    path = Path(weights)
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory on this machine (when only the engines see it: "
                         "check=False, --weights-on-engine)")
    if not any(any(path.glob(f"*.{ext}")) for ext in WEIGHT_FILES):
        raise ValueError(f"{path} holds no weights ({', '.join('*.' + e for e in WEIGHT_FILES)})")


def update_policy(engines: Sequence[str], weights: str | Path, version: int, *, mode: PauseMode = "keep",
                  api_key: str | None = None, guard_s: float = GUARD_S, reset_cache: bool = True,
                  check: bool = True, timeout_s: float = 600.0) -> PolicyUpdateReport:
    """Put the weights in `weights` (a checkpoint directory as the engines see it; checked here first unless
    `check` is off) into every engine as policy `version`; see the module docstring. Raises ValueError before
    touching an engine when the directory is unusable, PolicyUpdateFailed (with the report) when a step failed."""
    if not engines:
        raise ValueError("no engine to update")
    if check:
        check_weights(weights)
    started = time.time()
    t0 = time.monotonic()
    controls = [EngineControl(u, api_key=api_key, timeout_s=timeout_s) for u in engines]
    report = PolicyUpdateReport(version=version, weights=str(weights), label="", requested_mode=mode,
                                mark=VersionMark(version=version, at=started), started_at=started)
    paused: list[EngineControl] = []
    paused_at: float | None = None
    loading = consistent = False  # a load began; every engine holds the new weights and their label
    try:
        for engine in controls:
            chosen: PauseMode = mode if mode in engine.pause_modes() else "abort"
            # abort and wait end the requests they find: count them first. Keep freezes them, and so the gauges
            # (measured on vLLM 0.32: a kept request stays counted as running while paused): counting after the
            # pause counts exactly those kept, and reaches the pause one scrape sooner.
            counted = engine.requests() if chosen != "keep" else None
            if _step(report, "pause", engine, lambda e=engine, m=chosen: e.pause(m)) is None:
                break
            paused_at = paused_at or time.monotonic()
            running, waiting = counted if counted is not None else engine.requests()
            paused.append(engine)
            report.modes[engine.url] = chosen
            report.in_flight.append(InFlight(
                engine=engine.url, running=running, waiting=waiting, kept=running if chosen == "keep" else 0,
                aborted=running + waiting if chosen == "abort" else 0, drained=running if chosen == "wait" else 0))
        if len(paused) == len(controls):
            loading = True
            loaded = all(_step(report, "load", e, lambda e=e: e.reload(str(weights))) is not None for e in controls)
            if loaded:
                try:  # the marks so far: a call that straddles several updates is split at each
                    history = decode_label(controls[0].label())
                except (RuntimeError, httpx.HTTPError):
                    history = []  # the version step below fails on the same route and says so
                report.mark = VersionMark(version=version, at=time.time())
                report.label = encode_label([report.mark, *history])
                consistent = all([_step(report, "version", e, lambda e=e: e.set_label(report.label)) is not None
                                  for e in controls])
                if reset_cache:
                    for e in controls:
                        ok = _step(report, "reset_cache", e, e.reset_prefix_cache)
                        if ok is False:
                            report.steps[-1].ok = False
                            report.steps[-1].detail = "refused (blocks held by kept requests): old prefixes stay cached"
                time.sleep(max(0.0, report.mark.at + guard_s - time.time()))
    finally:
        if loading and not consistent:
            report.left_paused = True  # see the module docstring: resuming would break or mislabel
        else:
            for engine in paused:
                _step(report, "resume", engine, engine.resume)
        for engine in controls:
            engine.close()
    report.seconds = time.monotonic() - t0
    report.paused_seconds = time.monotonic() - paused_at if paused_at is not None else 0.0
    if not report.ok:
        raise PolicyUpdateFailed(report)
    return report


def engine_version(engines: Sequence[str], *, api_key: str | None = None) -> int:
    """The newest policy version the engines' labels name (0 for engines never updated): where a trainer that
    starts against a running job numbers its next update from, so the labels never go back."""
    versions = []
    for url in engines:
        engine = EngineControl(url, api_key=api_key, timeout_s=30)
        try:
            versions.append(label_version(engine.label()) or 0)
        finally:
            engine.close()
    return max(versions, default=0)


def update_service_policy(namespace: str, service: str, weights: str | Path, version: int, *, api_client: Any = None,
                          **kwargs: Any) -> PolicyUpdateReport:
    """`update_policy` over every ready replica behind a Kubernetes Service (tracefleet.trainer.replicas), the
    report saying which pod each engine URL is. `check` defaults to False here: the checkpoint directory is
    on the pods' volume. NoReplicas when the Service has no ready endpoint."""
    from tracefleet.trainer.replicas import service_replicas

    replicas = service_replicas(namespace, service, api_client=api_client)
    pods = {r.url: r.pod for r in replicas if r.pod}
    kwargs.setdefault("check", False)
    try:
        report = update_policy([r.url for r in replicas], weights, version, **kwargs)
    except PolicyUpdateFailed as exc:
        exc.report.pods = pods
        raise
    report.pods = pods
    return report


def engine_state(url: str, *, api_key: str | None = None) -> dict[str, Any]:
    """What `tracefleet policy show` prints: the engine's vLLM version, pause state, label and its version."""
    engine = EngineControl(url, api_key=api_key, timeout_s=30)
    try:
        label = engine.label()
        running, waiting = engine.requests()
        return {"engine": engine.url, "vllm": engine.version(), "paused": engine.is_paused(), "label": label,
                "policy_version": label_version(label), "running": running, "waiting": waiting}
    finally:
        engine.close()
