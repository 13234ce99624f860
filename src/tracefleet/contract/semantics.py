"""What a RolloutJob means: one definition for both drivers (`tracefleet run` and the operator).

Pure: no I/O, no clocks, no cluster. `tracefleet.runner.local` and `tracefleet.operator` (reconcile,
sessions, the sealer Job) call these functions; neither writes its own version of the rules.

Sessions and groups
    A job runs `samplesPerTask` sessions per task. Session `index` (job-wide, dense) is
    `task_index * samplesPerTask + sample_index`; the task's sessions form one GRPO group whose
    `group_id` is `<job>/<task id>`. Every trace carries `task_id`, `group_id` and `sample_index`.

Retries (`maxRetries`)
    A failed session is run again (up to `maxRetries` more times) only if it failed before its first
    model call: then nothing the policy did is in it (a workspace that could not be prepared, a proxy
    that was not reachable, a harness that crashed on start) and a rerun is an unbiased replacement.
    Once a model call was made, the failure is the policy's outcome and is data: retrying it until it
    succeeds would hide failures from the group and bias GRPO toward lucky samples. A session that was
    stopped (Ctrl-C, suspend) is neither failed nor retried: it is simply run again later.

Failed, timed-out and fail-closed sessions
    Every session that finished — completed, failed after its retries, timed out — is sealed, so a
    task's group stays whole. A session that did not complete is fail-closed: its traces carry
    `outcome="fail_closed"`, the reason `session_<status>:<stage>` (for example
    `session_timeout:harness`) beside the capture and evaluator reasons, and a reward of at most 0.
    A session without a single trainable call (it failed before a model call, or its only call broke
    off) is sealed as one row without tokens: it trains nothing, and counts in its group's statistics
    unless it is the infrastructure's (outcome kinds, below: one in which the engine answered nothing is).

Outcome kinds (`OutcomeKind`, the Parquet column `outcome_kind`; docs/training/outcomes.md has the table)
    Every row says whose outcome it is. `ok`: not fail-closed. `policy`: fail-closed by what the policy did
    (the harness timed out or exited with an error after the model answered, the agent broke its workspace,
    the model's tool calls could not be parsed, the evaluator judged it failed, timed out on it or errored on
    it): reward <= 0, counted in its group's statistics like any other sample. `infrastructure`: fail-closed
    by something the policy could not cause (the evaluator or verifier could not run or report, a stage of
    ours failed: the workspace, the proxy, the capture; the engine answered none of the session's calls, so
    nothing in it is the policy's): left out of the group statistics and the loss exactly like a quarantined row
    (`BatchReader` keeps it only with `include_infrastructure=True`), counted in the manifest
    (`outcome_kinds`), the run's summary and the operator's `status.counters.infrastructure`. One rule
    (`outcome_kind`) over the row's fail-closed reasons: a session in which the engine answered none of the
    calls is the infrastructure's whatever failed; else a policy reason wins (the reward would be <= 0
    whatever the infrastructure did), then an infrastructure reason; reasons that only follow from another
    (`no_trainable_calls`, `dropped_by_diagnostics`) decide nothing. An evaluator says it could not judge with
    the status `unavailable` (`EvalStatus`): a command or hook that exits `EVALUATOR_UNAVAILABLE_EXIT_CODE`
    (75, sysexits' EX_TEMPFAIL), a program of the judge's own that did not start, a Harbor verifier whose
    container did not run, an evaluator Job without the session's uploaded patch. Anything the agent could
    have caused stays the policy's (no reward unearned, design §2.8): a timeout (the agent's code runs under
    the judge), an error after the judge's program started, a test run without a report, a verifier that
    ran and wrote no reward, a patch that does not apply. A judging that reports `unavailable` is run again
    (`JUDGE_ATTEMPTS` in all) where the session ran or in the evaluator Job, over the same patch, before the
    verdict is kept. A group left with fewer than two valid samples trains nothing (advantage 0).

Batching (`output.tracesPerBatch`)
    A batch holds whole groups, so the GRPO statistics a trainer computes per batch see every sample
    of a task. The batch size is counted in sessions (rollouts; one session is one trace row unless
    prefix-merge splits it at a compaction or sub-agent): a batch is sealed as soon as the groups in it
    hold at least `tracesPerBatch` sessions, that is `ceil(tracesPerBatch / samplesPerTask)` groups; the
    last batch holds what is left. Which groups share a batch follows the order they finish in; how
    many batches a job has does not.

Auxiliary calls
    Calls a harness makes beside the agent's conversation (OpenCode's title generation, a summary the
    harness asks for) start their own trace, labelled `new_root_reason="auxiliary"` (the Parquet column
    `new_root_reason`). They are sealed (nothing captured is lost) but not trained on by default: their
    tokens did not cause the session's outcome, and giving them the agent's advantage would push title
    generation up or down with it. `BatchReader` leaves them out of `advantages()` and `tensors()` (and
    out of the group statistics) unless asked with `include_auxiliary=True`. A session whose only
    traces are auxiliary also gets the row without tokens, so its group stays whole.

Diagnostics (`spec.diagnostics`, tracefleet.diagnostics)
    After judging, each finished session's evidence (calls, workspace diff, evaluator, harness, timings,
    task) is read by the job's diagnostics; every finding is a `diagnostics` column entry on the
    session's rows and counted per diagnostic in the batch manifest. Without `spec.diagnostics` every
    built-in runs with action `flag` (recorded only). `quarantine`: the session is sealed with its findings,
    its reward forced to <= 0 and its rows marked `quarantined`; `BatchReader` leaves quarantined rows out
    of `advantages()` and `tensors()` and out of the group statistics unless `include_quarantined=True`.
    Why out of the statistics, and not only a reward of 0: a finding says the reward is not evidence of
    the task being done, so the group's baseline is estimated from the sessions whose rewards are valid;
    a trainer that wants the hacks as negative examples includes them (their reward is <= 0). `drop`: the
    session's token rows are not sealed; it leaves one row without tokens (reason
    `dropped_by_diagnostics`, its findings, `quarantined`), so the drop is counted and the group whole.

Quarantine rate (`spec.diagnosticsPolicy`)
    Both drivers count a job's sessions from its sealed batch manifests (`diagnostics_counts`): `judged`
    (every sealed session was judged), `quarantined` (kept out of training by a diagnostic: quarantine
    or drop) and `dropped` (of those, the ones whose token rows were not sealed); the operator's status
    `counters` and `tracefleet run`'s summary show the same numbers. Once at least `minJudgedSessions`
    sessions are judged, a quarantine rate (quarantined / judged) above `maxQuarantineRate` sets the
    condition `QuarantineRateExceeded` (reason `QuarantineRateAboveThreshold`, a Warning Event with the
    numbers on the operator, one WARNING line locally); back at or below it, the condition turns False.
    The job goes on: what a diagnostic quarantined is already out of training, so the batches a trainer
    reads stay valid, and a rate measured on the first batches is a signal for a person (an exploitable
    evaluator, a diagnostic that misfires), not a verdict on the rest; suspend the job to stop it.
    Defaults (0.25 over at least 8 sessions): a job whose sessions are mostly hacks shows at its first
    full batch, while one or two quarantined sessions in a small first group do not.

Presets
    A harness without a preset runs its `command` (preset `command`); an evaluator preset maps to the
    runner's evaluator type (`hook` is the runner's `python` evaluator), and no preset means `command`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # batch.py imports OutcomeKind from here
    from tracefleet.contract.batch import BatchManifest

# ---------------------------------------------------------------- presets

DEFAULT_PRESET = "command"  # harness and evaluator alike: no preset means "run the command"
# The one default of each time limit (spec.harness.sessionTimeoutSeconds, spec.evaluator.timeoutSeconds), which the
# RolloutJob's fields and a session's plan (tracefleet.contract.session) both take.
SESSION_TIMEOUT_S = 1800
EVALUATOR_TIMEOUT_S = 600
# The one default of spec.harness.workspace.workdir: the directory a harness starts in, the same path on both drivers
# (a harness that writes its working directory into its prompt, as Pi does, then sends every session the same one).
WORKDIR = "/workspace"

# RolloutJob evaluator presets -> the runner's evaluator types.
EVALUATOR_TYPES = {"tests": "tests", "hook": "python", "command": "command", "harbor": "harbor"}


def harness_preset(preset: str | None) -> str:
    """The preset a harness runs: its own, or `command`."""
    return preset or DEFAULT_PRESET


def evaluator_type(preset: str | None) -> str:
    """The runner's evaluator type for a RolloutJob evaluator preset (None: `command`)."""
    key = preset or DEFAULT_PRESET
    if key not in EVALUATOR_TYPES:
        raise ValueError(f"evaluator preset {key!r}: expected one of {', '.join(EVALUATOR_TYPES)}")
    return EVALUATOR_TYPES[key]


# ---------------------------------------------------------------- auxiliary calls

AUXILIARY = "auxiliary"  # new_root_reason of a call beside the agent's conversation


# ---------------------------------------------------------------- diagnostics

DROPPED_BY_DIAGNOSTICS = "dropped_by_diagnostics"  # fail-closed reason of the row a dropped session leaves

# The quarantine-rate condition, the same in both drivers (the operator's status and Event, `tracefleet run`).
QUARANTINE_RATE_EXCEEDED = "QuarantineRateExceeded"  # condition type
REASON_QUARANTINE_RATE_ABOVE = "QuarantineRateAboveThreshold"  # condition True; also the Warning Event's reason
REASON_QUARANTINE_RATE_WITHIN = "QuarantineRateWithinThreshold"
REASON_TOO_FEW_JUDGED = "TooFewSessionsJudged"
DEFAULT_MAX_QUARANTINE_RATE = 0.25
DEFAULT_MIN_JUDGED_SESSIONS = 8


@dataclass(frozen=True)
class DiagnosticsCounts:
    """Sessions of sealed batches as the diagnostics judged them; per diagnostic, the quarantined (dropped)
    sessions with a finding of it, as the manifest counts them (a session with findings of two diagnostics
    counts for both)."""

    judged: int = 0
    quarantined: int = 0  # quarantine or drop: left out of training
    dropped: int = 0  # of those, no token rows sealed
    quarantined_by: dict[str, int] = field(default_factory=dict)
    dropped_by: dict[str, int] = field(default_factory=dict)

    def __add__(self, other: DiagnosticsCounts) -> DiagnosticsCounts:
        return DiagnosticsCounts(
            self.judged + other.judged, self.quarantined + other.quarantined, self.dropped + other.dropped,
            _add_counts(self.quarantined_by, other.quarantined_by), _add_counts(self.dropped_by, other.dropped_by))

    @property
    def rate(self) -> float:
        """Quarantined / judged (0 before anything is judged)."""
        return self.quarantined / self.judged if self.judged else 0.0

    def to_json(self) -> dict[str, Any]:
        """The wire form the operator keeps with a recorded batch (`from_json` reads it back)."""
        return {"judged": self.judged, "quarantined": self.quarantined, "dropped": self.dropped,
                "quarantinedBy": dict(self.quarantined_by), "droppedBy": dict(self.dropped_by)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> DiagnosticsCounts:
        data = data or {}
        return cls(int(data.get("judged", 0)), int(data.get("quarantined", 0)), int(data.get("dropped", 0)),
                   {str(k): int(v) for k, v in (data.get("quarantinedBy") or {}).items()},
                   {str(k): int(v) for k, v in (data.get("droppedBy") or {}).items()})


def _add_counts(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in sorted({*a, *b})}


def diagnostics_counts(manifest: BatchManifest) -> DiagnosticsCounts:
    """One sealed batch's counts, from its manifest."""
    per = manifest.diagnostics
    return DiagnosticsCounts(
        judged=manifest.sessions,
        quarantined=manifest.quarantined_sessions,
        dropped=manifest.dropped_sessions,
        quarantined_by={k: v.quarantined for k, v in sorted(per.items()) if v.quarantined},
        dropped_by={k: v.dropped for k, v in sorted(per.items()) if v.dropped},
    )


@dataclass(frozen=True)
class QuarantineVerdict:
    """The `QuarantineRateExceeded` condition: whether it holds, why, and the numbers."""

    exceeded: bool
    reason: str
    message: str


def quarantine_verdict(counts: DiagnosticsCounts, max_rate: float = DEFAULT_MAX_QUARANTINE_RATE,
                       min_judged: int = DEFAULT_MIN_JUDGED_SESSIONS) -> QuarantineVerdict:
    """Whether the job's quarantine rate crossed `spec.diagnosticsPolicy` (see the module doc)."""
    numbers = (f"{counts.quarantined} of {counts.judged} judged sessions quarantined ({counts.rate:.0%}"
               + (f", {counts.dropped} of them dropped" if counts.dropped else "") + ")")
    by = "; by diagnostic: " + ", ".join(f"{k} {v}" for k, v in counts.quarantined_by.items()) if counts.quarantined_by else ""
    if counts.judged < min_judged:
        return QuarantineVerdict(False, REASON_TOO_FEW_JUDGED, f"{numbers}; the rate applies from {min_judged} judged sessions{by}")
    if counts.rate > max_rate:
        return QuarantineVerdict(True, REASON_QUARANTINE_RATE_ABOVE, f"{numbers} > maxQuarantineRate {max_rate:g}{by}")
    return QuarantineVerdict(False, REASON_QUARANTINE_RATE_WITHIN, f"{numbers} <= maxQuarantineRate {max_rate:g}{by}")


# ---------------------------------------------------------------- the session plan


def group_id(job: str, task_id: str) -> str:
    """The GRPO group of a task's samples."""
    return f"{job}/{task_id}"


def session_index(task_index: int, sample_index: int, samples_per_task: int) -> int:
    return task_index * samples_per_task + sample_index


def task_and_sample(index: int, samples_per_task: int) -> tuple[int, int]:
    """(task index, sample index) of a job-wide session index."""
    return divmod(index, samples_per_task)


@dataclass(frozen=True)
class PlannedSession:
    index: int  # job-wide session number
    task_index: int
    task_id: str
    sample_index: int
    group_id: str


def session_plan(job: str, task_ids: Sequence[str], samples_per_task: int) -> list[PlannedSession]:
    """Every session of the job, in index order."""
    return [
        PlannedSession(session_index(t, s, samples_per_task), t, task_id, s, group_id(job, task_id))
        for t, task_id in enumerate(task_ids)
        for s in range(samples_per_task)
    ]


# ---------------------------------------------------------------- retries


def should_retry(*, model_calls: int, retries_done: int, max_retries: int) -> bool:
    """Whether a failed (not stopped) session runs again: only if it failed before its first model call."""
    return model_calls == 0 and retries_done < max_retries


# ---------------------------------------------------------------- failed sessions

COMPLETED = "completed"
SESSION_FAILURE_PREFIX = "session_"


def session_failure_reason(status: str, stage: str | None) -> str | None:
    """The fail-closed reason a session that did not complete carries (None for a completed one)."""
    if status == COMPLETED or stage == "evaluate":
        return None  # a judging that failed is the evaluator's reason (evaluator_<status>), not the session's
    return f"{SESSION_FAILURE_PREFIX}{status}:{stage or 'unknown'}"


def runs_again(fail_closed_reasons: Sequence[str], model_calls: int) -> bool:
    """Whether a session already in a sealed batch runs again when its job is run again: it failed before its
    first model call (a harness that could not start, a CLI not installed: what `should_retry` retries, after the
    retries ran out), which the user can fix; its sealed row holds no token. A session that made a model call
    stays sealed: its row is data, the policy's or the infrastructure's as `outcome_kind` decides (an infrastructure
    row is already left out of training, and running the session again would sample the policy anew)."""
    return model_calls == 0 and any(r.startswith(SESSION_FAILURE_PREFIX) for r in fail_closed_reasons)


# ---------------------------------------------------------------- outcome kinds


class OutcomeKind(StrEnum):
    """Whose outcome a sealed row is (the `outcome_kind` column; see the module doc)."""

    OK = "ok"  # not fail-closed
    POLICY = "policy"  # fail-closed by what the policy did: reward <= 0, counted
    INFRASTRUCTURE = "infrastructure"  # fail-closed by what the policy could not cause: left out of training


# How each kind reads, the same words on every surface that shows one (the traces CLI, the run's summary, the
# dashboard): whose outcome the row is.
OUTCOME_KIND_WORDS = {OutcomeKind.OK: "ok", OutcomeKind.POLICY: "the policy's",
                      OutcomeKind.INFRASTRUCTURE: "the infrastructure's"}
# ...and what it means for training, where a surface has room to say it
OUTCOME_KIND_MEANING = {OutcomeKind.OK: "trained on", OutcomeKind.POLICY: "reward <= 0, trained on",
                        OutcomeKind.INFRASTRUCTURE: "left out of the group statistics and the loss"}


# The fail-closed reasons (TraceMetadata.fail_closed_reasons), besides `session_<status>:<stage>`.
CAPTURE_TORN_TAIL = "capture_torn_tail"  # the capture log's last line is cut off
CAPTURE_BAD_LINES = "capture_bad_lines"  # capture log lines that do not read
CAPTURE_INCOMPLETE = "capture_incomplete"  # the proxy session was not closed cleanly
REWARD_MISSING = "reward_missing"  # the evaluator said ok and gave no reward
TOOL_PARSE_ERRORS = "tool_parse_errors"  # a call's tool calls could not be parsed from the model's output
NO_TRAINABLE_CALLS = "no_trainable_calls"  # the row without tokens of a session with no trainable call
EVALUATOR_REASON = "evaluator_{}"  # the judging did not say ok: evaluator_<status>

# How an evaluator program says "I could not judge" (not "the agent failed"): sysexits' EX_TEMPFAIL.
EVALUATOR_UNAVAILABLE_EXIT_CODE = 75
# Judgings that report `unavailable` are run this many times in all (over the same patch) before the verdict is kept.
JUDGE_ATTEMPTS = 2
# Stages of ours (tracefleet.contract.session.Stage): a session failing there did not fail by the policy.
INFRASTRUCTURE_STAGES = frozenset({"prepare", "register", "capture", "build"})
INFRASTRUCTURE_REASONS = frozenset({
    CAPTURE_TORN_TAIL, CAPTURE_BAD_LINES, CAPTURE_INCOMPLETE, REWARD_MISSING,
    EVALUATOR_REASON.format("unavailable"),  # the evaluator could not run or report (EvalStatus)
    EVALUATOR_REASON.format("missing"),  # no verdict: the session was never judged (alone: its judging was lost)
})
POLICY_REASONS = frozenset({
    TOOL_PARSE_ERRORS,
    EVALUATOR_REASON.format("error"),  # the judge ran and failed on what the agent left (or patch_failed, skipped)
    EVALUATOR_REASON.format("timeout"),  # the agent's code runs under the judge
})
# Reasons that follow from another one and decide nothing themselves.
CONSEQUENT_REASONS = frozenset({NO_TRAINABLE_CALLS, DROPPED_BY_DIAGNOSTICS})


def reason_kind(reason: str) -> OutcomeKind | None:
    """Whose one fail-closed reason is (None: it decides nothing by itself)."""
    if reason in CONSEQUENT_REASONS:
        return None
    if reason in INFRASTRUCTURE_REASONS:
        return OutcomeKind.INFRASTRUCTURE
    if reason.startswith("session_"):
        ours = reason.partition(":")[2] in INFRASTRUCTURE_STAGES
        return OutcomeKind.INFRASTRUCTURE if ours else OutcomeKind.POLICY
    return OutcomeKind.POLICY  # the listed policy reasons, and any reason not classified yet: fail closed


def outcome_kind(reasons: Iterable[str], *, model_answered: bool = True) -> OutcomeKind:
    """A row's kind from its fail-closed reasons: ok without any. `model_answered`: whether the engine answered
    any of the session's model calls; a session in which it answered none holds nothing the policy did (the
    premise of `should_retry`): the infrastructure's, whatever failed. Else a policy reason wins (the reward is
    <= 0 whatever else happened), then an infrastructure one; only consequent reasons: the policy's."""
    kinds = {reason_kind(r) for r in reasons}
    if not kinds:
        return OutcomeKind.OK
    if not model_answered:
        return OutcomeKind.INFRASTRUCTURE
    if OutcomeKind.POLICY in kinds or kinds == {None}:
        return OutcomeKind.POLICY
    return OutcomeKind.INFRASTRUCTURE


@dataclass(frozen=True)
class OutcomeCounts:
    """Sessions of sealed batches by outcome kind, as the manifests count them (`outcome_kinds`)."""

    ok: int = 0
    policy: int = 0
    infrastructure: int = 0

    def __add__(self, other: OutcomeCounts) -> OutcomeCounts:
        return OutcomeCounts(self.ok + other.ok, self.policy + other.policy, self.infrastructure + other.infrastructure)

    def to_json(self) -> dict[str, int]:
        """The wire form the operator keeps with a recorded batch (`from_json` reads it back)."""
        return {k.value: getattr(self, k.value) for k in OutcomeKind}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> OutcomeCounts:
        data = data or {}
        return cls(**{k.value: int(data.get(k.value, 0)) for k in OutcomeKind})


def outcome_counts(manifest: BatchManifest) -> OutcomeCounts:
    """One sealed batch's sessions by kind, from its manifest (batches sealed before kinds: none)."""
    return OutcomeCounts.from_json(manifest.outcome_kinds)


# ---------------------------------------------------------------- batching


def groups_per_batch(traces_per_batch: int, samples_per_task: int) -> int:
    """Whole groups per batch: the fewest that hold at least `tracesPerBatch` sessions."""
    return max(1, math.ceil(traces_per_batch / max(1, samples_per_task)))


def batch_count(task_count: int, traces_per_batch: int, samples_per_task: int) -> int:
    """Batches a job that runs to the end seals."""
    return math.ceil(task_count / groups_per_batch(traces_per_batch, samples_per_task))


def next_batches(ready_groups: Iterable[int], per_batch: int, *, final: bool) -> list[list[int]]:
    """Cut finished, unsealed groups (in the order given) into batches of `per_batch` groups; the
    remainder waits for more groups unless this is the end of the job (`final`)."""
    ready = list(ready_groups)
    out = [ready[i : i + per_batch] for i in range(0, len(ready), per_batch)]
    if out and len(out[-1]) < per_batch and not final:
        out.pop()
    return out


# ---------------------------------------------------------------- session sets on the wire


def encode_ranges(indices: list[int]) -> str:
    """Compact, order-free encoding of a set of session indices: '0-63,70,72-75'."""
    out: list[str] = []
    xs = sorted(set(indices))
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)


def decode_ranges(text: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out
