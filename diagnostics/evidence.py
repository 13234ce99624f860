"""Session evidence: everything a diagnostic may read about one finished session, one typed object.

Built by `session_evidence` from what the session lifecycle holds after judging: the capture log (the
calls: text, tool calls, finish reasons, unparsed tool calls, policy versions), the workspace diff
(`session.patch`, taken before any evaluator restores protected files, so files the evaluator put back
are still listed), the evaluator's outcome, the harness's exit and stderr tail, the timings and the task.
The session program builds it (`runner.session.evidence_of`, over the judged SessionResult): where the
session ran on this machine, and on Kubernetes in the evaluator Job (the pod program that holds the
patch, the task and the judging; it reads the capture the harness pod uploaded), which writes it to
`layout.evidence_key`, where the sealer and `tracefleet diagnose` read it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from tracefleet.contract.session import EvalOutcome

EVIDENCE_VERSION = 1
TAIL_CHARS = 4000  # stdout/stderr/evaluator output kept per session

FileChangeKind = Literal["added", "modified", "deleted", "renamed"]


class CallEvidence(BaseModel):
    call_id: str
    index: int  # position in the capture log
    status: str = "ok"  # ok | error | partial
    finish_reason: str | None = None
    text: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    tool_parse_errors: list[str] = Field(default_factory=list)
    policy_version: int = 0
    # (policy version, tokens) it sampled, in output order: more than one when it straddled a weight update
    versions: list[tuple[int, int]] = Field(default_factory=list)
    completion_tokens: int = 0
    drift: bool = False  # server mode: the prompt did not extend the parent's prompt + completion
    auxiliary: bool = False  # a call beside the agent's conversation (not trained on by default)


class AddedLine(BaseModel):
    line: int  # 1-based, in the new file
    text: str


class FileChange(BaseModel):
    path: str  # the path after the change (the old path for a deletion)
    change: FileChangeKind
    old_path: str | None = None  # renamed: where it came from
    added: list[AddedLine] = Field(default_factory=list)
    removed: int = 0  # lines removed


class HarnessEvidence(BaseModel):
    preset: str | None = None
    status: str = "completed"  # the session's status (runner.session.SessionStatus)
    stage: str | None = None
    error: str | None = None
    exit_code: int | None = None
    stderr_tail: str = ""


class EvaluatorEvidence(BaseModel):
    status: str = "missing"  # ok | error | timeout | patch_failed | missing (never judged)
    reward: float | None = None  # the evaluator's reward (None: never judged)
    message: str | None = None
    output_tail: str = ""  # the evaluator's output (tests' output, a command's stderr), as it reported it
    exit_code: int | None = None


class SessionEvidence(BaseModel):
    evidence_version: int = EVIDENCE_VERSION
    job: str
    session_id: str
    task_id: str
    group_id: str | None = None
    sample_index: int = 0
    task: dict[str, Any] = Field(default_factory=dict)  # the runner's Task as JSON (prompt, protected, tests)
    calls: list[CallEvidence] = Field(default_factory=list)
    capture_torn: bool = False
    patch: str = ""
    files: list[FileChange] = Field(default_factory=list)
    harness: HarnessEvidence = Field(default_factory=HarnessEvidence)
    evaluator: EvaluatorEvidence = Field(default_factory=EvaluatorEvidence)
    timings: dict[str, float] = Field(default_factory=dict)
    policy_version: int | None = None  # the job's policy version when the session was sealed (lag reference)

    @property
    def reward(self) -> float | None:
        """What the evaluator gave (before any fail-closed or diagnostic rule)."""
        return self.evaluator.reward

    @property
    def agent_calls(self) -> list[CallEvidence]:
        return [c for c in self.calls if not c.auxiliary]


_DIFF_HEADER = re.compile(r"^diff --git a/(.*) b/(.*)$")
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def patch_files(patch: str) -> list[FileChange]:
    """The files a `git diff` touches, with each added line's number in the new file."""
    files: list[FileChange] = []
    current: FileChange | None = None
    line_no = 0
    in_hunk = False
    for raw in patch.splitlines():
        header = _DIFF_HEADER.match(raw)
        if header:
            current = FileChange(path=header.group(2), change="modified")
            files.append(current)
            in_hunk = False
            continue
        if current is None:
            continue
        if not in_hunk:
            if raw.startswith("new file mode"):
                current.change = "added"
            elif raw.startswith("deleted file mode"):
                current.change = "deleted"  # git names a deleted file a/x b/x
            elif raw.startswith("rename from "):
                current.change, current.old_path = "renamed", raw[len("rename from "):]
            elif raw.startswith("rename to "):
                current.path = raw[len("rename to "):]
        hunk = _HUNK.match(raw)
        if hunk:
            in_hunk, line_no = True, int(hunk.group(1))
            continue
        if not in_hunk:
            continue
        if raw.startswith("+"):
            current.added.append(AddedLine(line=line_no, text=raw[1:]))
            line_no += 1
        elif raw.startswith("-"):
            current.removed += 1
        elif not raw.startswith("\\"):
            line_no += 1
    return files


def _tail(text: str | None) -> str:
    return (text or "")[-TAIL_CHARS:]


def read_tail(path: str | os.PathLike[str] | None) -> str:
    """The last TAIL_CHARS characters of a file ('' when it does not exist)."""
    if path is None or not Path(path).exists():
        return ""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - TAIL_CHARS * 4))
        return _tail(f.read().decode(errors="replace"))


def call_evidence(capture: str | os.PathLike[str] | None) -> tuple[list[CallEvidence], bool]:
    """(the calls of a capture log, whether its last line was torn); no log: no calls."""
    if capture is None or not os.path.exists(capture):
        return [], False
    # imported here: tracefleet.api's model imports this package's built-in names
    from tracefleet.contract.semantics import AUXILIARY
    from tracefleet.contract.capture import read_capture_log
    from tracefleet.contract.policy import policy_spans

    log = read_capture_log(capture)
    calls = [
        CallEvidence(
            call_id=r.call_id, index=i, status=r.status, finish_reason=r.finish_reason, text=r.output_text,
            tool_calls=list(r.tool_calls), tool_parse_errors=list(r.tool_parse_errors), policy_version=r.policy_version,
            versions=[(v, e - b) for v, b, e in policy_spans(r.weight_versions, r.policy_version, len(r.completion_ids))],
            completion_tokens=r.completion_tokens or len(r.completion_ids),
            drift=bool(r.splice and r.splice.drift), auxiliary=bool(r.splice and r.splice.new_root_reason == AUXILIARY),
        )
        for i, r in enumerate(log.records)
    ]
    return calls, log.torn_tail


def evaluator_evidence(evaluation: EvalOutcome | None) -> EvaluatorEvidence:
    """From the evaluator's verdict (None: never judged)."""
    if evaluation is None:
        return EvaluatorEvidence()
    details = evaluation.details
    output = next((details[k] for k in ("output_tail", "stderr_tail", "stdout_tail") if details.get(k)), "")
    return EvaluatorEvidence(status=evaluation.status, reward=evaluation.reward, message=evaluation.message,
                             output_tail=_tail(str(output)), exit_code=details.get("exit_code"))


def session_evidence(
    *,
    job: str,
    session_id: str,
    task: Any,
    group_id: str | None,
    sample_index: int,
    capture: str | os.PathLike[str] | None,
    patch: str,
    harness: HarnessEvidence,
    evaluation: EvalOutcome | None,
    timings: dict[str, float] | None = None,
    policy_version: int | None = None,
) -> SessionEvidence:
    """The one way session evidence is built (local lifecycle and the evaluator Job alike)."""
    calls, torn = call_evidence(capture)
    task_json = task.model_dump(mode="json", by_alias=False) if hasattr(task, "model_dump") else dict(task or {})
    return SessionEvidence(
        job=job, session_id=session_id, task_id=str(task_json.get("id", "")), group_id=group_id, sample_index=sample_index,
        task=task_json, calls=calls, capture_torn=torn, patch=patch, files=patch_files(patch),
        harness=harness.model_copy(update={"stderr_tail": _tail(harness.stderr_tail)}),
        evaluator=evaluator_evidence(evaluation), timings=dict(timings or {}), policy_version=policy_version,
    )


def stored_evidence(bucket: Any, job: str, session_id: str) -> SessionEvidence | None:
    """A session's evidence kept in the bucket (`layout.evidence_key`), None when there is none."""
    from tracefleet.bucket import ObjectNotFound
    from tracefleet.contract.layout import evidence_key

    try:
        return SessionEvidence.model_validate_json(bucket.get(evidence_key(job, session_id)))
    except ObjectNotFound:
        return None
