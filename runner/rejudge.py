"""A rerun judges again the sealed sessions the judge could not judge (tracefleet.contract.rejudge), without running
their harness: the session's patch, kept in its evidence in the bucket, is judged on a fresh copy of the task's
workspace by the job's evaluator as it is now (the evaluator Job's way: tracefleet.runner.pod.evaluator_job), the
job's diagnostics read the evidence with the new verdict, and the verdicts go to `<job>/rejudged/<stamp>.json`, which
`BatchReader` applies to the sessions' sealed rows (tracefleet.traces.rejudge). The session's evidence in the bucket
is replaced by the re-judged one (`tracefleet diagnose` reads it).

A session is left as sealed, with one line saying why, when it cannot be judged here: its evidence was not kept, its
task's workspace does not build, or its task is a Harbor task (its verifier runs in the session's own container,
which is gone).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracefleet.bucket import Bucket
from tracefleet.contract import layout
from tracefleet.contract.rejudge import RejudgedSession, Rejudging
from tracefleet.contract.semantics import EVALUATOR_REASON
from tracefleet.contract.session import SessionPlan, SessionResult
from tracefleet.diagnostics.evidence import SessionEvidence, evaluator_evidence, stored_evidence
from tracefleet.runner.session import eval_context, judge
from tracefleet.runner.sink import RejudgeCandidate
from tracefleet.runner.tracing import evaluator_status
from tracefleet.runner.workspace import WorkspaceError, prepare_workspace
from tracefleet.traces.reader import BatchReader
from tracefleet.traces.rejudge import batch_counts, current_rejudgings, read_as_now, write_rejudging


@dataclass
class RejudgeReport:
    """What a rerun's re-judging did: the verdicts written, and the sessions left as sealed (with why)."""

    verdicts: dict[str, RejudgedSession] = field(default_factory=dict)
    left: dict[str, str] = field(default_factory=dict)  # session id -> why it was not judged again
    key: str | None = None  # the object written

    def line(self) -> str:
        """The summary's row: how many were judged again, what they are now, what was left."""
        now = Counter("judged" if not v.reasons else v.reasons[0].removeprefix(EVALUATOR_REASON.format(""))
                      for v in self.verdicts.values())
        text = (f"{len(self.verdicts)} sealed session(s) the judge could not judge, judged again without their harness: "
                + ", ".join(f"{n} {what}" for what, n in sorted(now.items()))) if self.verdicts else "none"
        return text + (f"; {len(self.left)} left as sealed ({next(iter(self.left.values()))})" if self.left else "")


def rejudge(bucket: Bucket, job: str, candidates: Sequence[RejudgeCandidate], plans: dict[tuple[str, int], SessionPlan],
            work_dir: Path, say: Callable[[str], None]) -> RejudgeReport:
    """Judge `candidates` again with their plans' evaluator; the verdicts are written as one re-judging."""
    report = RejudgeReport()
    for candidate in candidates:
        plan = plans.get((candidate.task_id, candidate.sample_index))
        evidence = stored_evidence(bucket, job, candidate.session_id)
        if plan is None:
            report.left[candidate.session_id] = f"{candidate.session_id}: its task {candidate.task_id!r} is no longer in the job"
        elif plan.task.harbor is not None:
            report.left[candidate.session_id] = (f"{candidate.session_id}: a Harbor task's verifier runs in the "
                                                 "session's own container, which is gone")
        elif evidence is None:
            report.left[candidate.session_id] = f"{candidate.session_id}: no evidence kept in the bucket (its patch)"
        else:
            try:
                report.verdicts[candidate.session_id] = _judged_again(bucket, plan, evidence, candidate.why, work_dir)
                continue
            except WorkspaceError as exc:
                report.left[candidate.session_id] = f"{candidate.session_id}: rebuilding its task's workspace failed: {exc}"
        say(f"session {candidate.session_id} ({candidate.why}) is not judged again: {report.left[candidate.session_id]}")
    if report.verdicts:
        seqs = {c.seq for c in candidates if c.session_id in report.verdicts}
        report.key = write_rejudging(bucket, Rejudging(job=job, sessions=report.verdicts,
                                                       batches=_recounted(bucket, job, seqs, report.verdicts)))
    return report


def _recounted(bucket: Bucket, job: str, seqs: set[int], verdicts: dict[str, RejudgedSession] | None = None,
               superseded: dict[str, int] | None = None) -> dict[int, dict[str, Any]]:
    """Each batch in `seqs`: its manifest's counts from its rows as read with every re-judging so far and
    `verdicts`, `superseded` (this rerun's)."""
    reader = BatchReader(bucket, job)
    now = current_rejudgings(bucket, job)
    now.sessions.update(verdicts or {})
    now.superseded.update(superseded or {})
    return {seq: batch_counts(read_as_now(reader.read_table(seq), now, seq)) for seq in sorted(seqs)}


def supersede(bucket: Bucket, job: str, resealed: dict[str, int], sealed_in: dict[str, int]) -> str | None:
    """Sessions this run ran again and sealed anew (`resealed`: session id -> its new batch) no longer read from the
    batch of their earlier rows (`sealed_in`: session id -> that batch), that batch recounted without them; the
    re-judging's key (None: none ran again)."""
    if not resealed:
        return None
    earlier = {sealed_in[sid] for sid in resealed if sid in sealed_in}
    return write_rejudging(bucket, Rejudging(job=job, superseded=dict(resealed),
                                             batches=_recounted(bucket, job, earlier, superseded=resealed)))


def _judged_again(bucket: Bucket, plan: SessionPlan, evidence: SessionEvidence, why: str, work_dir: Path) -> RejudgedSession:
    """One session's new verdict over its kept patch; its evidence in the bucket replaced by the re-judged one."""
    from tracefleet.diagnostics.registry import configured, run_diagnostics

    result = SessionResult.for_plan(plan)
    result.harness_exit_code = evidence.harness.exit_code
    work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"rejudge-{plan.session_id}-", dir=work_dir) as tmp:
        session_dir = Path(tmp) / "session"
        workspace = prepare_workspace(plan.task, session_dir, setup_timeout_s=plan.setup_timeout_s)
        stdout = Path(tmp) / layout.HARNESS_STDOUT  # the harness's stdout stayed where it ran
        stdout.write_text("")
        outcome = judge(plan, eval_context(plan, workspace, evidence.patch, session_dir, result, stdout))
    judged = result.judged(outcome)
    evidence = evidence.model_copy(update={
        "evaluator": evaluator_evidence(judged.evaluation),
        "harness": evidence.harness.model_copy(update={"status": judged.status, "stage": judged.stage,
                                                        "error": judged.error})})
    bucket.put(layout.evidence_key(plan.job, plan.session_id), evidence.model_dump_json().encode())
    findings = run_diagnostics(evidence, resolved=configured(plan.diagnostics))
    status = evaluator_status(judged)
    return RejudgedSession(
        why=why, evaluation=outcome.judging(), reward=judged.reward,
        reasons=[] if status == "ok" else [EVALUATOR_REASON.format(status)],
        status=judged.status, stage=judged.stage, error=judged.error,
        findings=[f.model_dump(mode="json") for f in findings.findings], quarantined=findings.quarantined)
