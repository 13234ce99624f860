"""Policy updates: what a trainer's weight sync tells the engine, and what it reports back.

Two messages cross processes here.

**The engine's weight-version label** (trainer -> engine -> every proxy). The trainer control
(`tracefleet.trainer.control`) sets vLLM's weight-version label (`/update_weight_version`, read back on
`/weight_info`; vLLM >= 0.33 also stamps it on each sampled token's `weight_versions` span) to a list of
*marks*, newest first: `"3@1764075000.512 2@1764074000.104"`. A mark says "policy version 3 is what the engine
samples with from unix time 1764075000.512 on". The time is taken while the engine is paused, after the new
weights are in and before generation resumes, so every token sampled by the old weights reached a proxy
before it, and every token sampled by the new ones after it: a proxy that never hears from the trainer
learns, from one read of the label, which version sampled each token it received (tracefleet.proxy.versions).
The label keeps the last `MAX_MARKS` marks, so a call that straddles several updates is still split right.
A label that holds no mark (vLLM's initial `"default"`, or one a trainer set by hand) names no version.

**The update report** (`PolicyUpdateReport`): what one update did on each engine, how long each step took,
and what happened to the requests that were in flight.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

MAX_MARKS = 8
_MARK = re.compile(r"^(\d+)@(\d+(?:\.\d+)?)$")

PauseMode = Literal["keep", "abort", "wait"]
StepName = Literal["pause", "load", "version", "reset_cache", "resume"]


class VersionMark(BaseModel):
    """Policy `version` samples from unix time `at` on (see the module docstring)."""

    version: int = Field(ge=0)
    at: float


def encode_label(marks: list[VersionMark]) -> str:
    """The engine label for these marks (newest first, at most MAX_MARKS)."""
    return " ".join(f"{m.version}@{m.at:.3f}" for m in marks[:MAX_MARKS])


def decode_label(label: str | None) -> list[VersionMark]:
    """The marks a label holds, newest first; [] for a label that is not one of ours."""
    marks: list[VersionMark] = []
    for part in (label or "").split():
        m = _MARK.match(part)
        if m is None:
            return []
        marks.append(VersionMark(version=int(m.group(1)), at=float(m.group(2))))
    return marks


def label_version(label: str | None) -> int | None:
    """The policy version a label names (its newest mark, or a bare integer label), or None."""
    if label is not None and label.strip().isdigit():
        return int(label.strip())
    marks = decode_label(label)
    return marks[0].version if marks else None


def version_at(marks: list[VersionMark], t: float) -> int | None:
    """The version the engine sampled with at unix time t (marks newest first), or None before the oldest."""
    for mark in marks:
        if mark.at <= t:
            return mark.version
    return None


class WeightVersionSpan(BaseModel):
    """Output tokens [start, end) of one call were sampled by the weights labelled `version` (vLLM's
    `weight_versions` shape; tracefleet's proxy writes the same shape on engines that do not report it).
    `margin_s`: on a span the proxy inferred that starts at an update, how far (seconds) from the update's
    mark the tokens on either side of its start arrived; the split is exact while this exceeds the clock skew
    between the trainer and the proxy."""

    version: str
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    margin_s: float | None = None


def policy_spans(spans: list[dict] | None, default: int, total: int) -> list[tuple[int, int, int]]:
    """[(policy version, start, end)] over a call's `total` output tokens, from its capture record's
    `weight_versions` (labels that name no version are `default`, the version the call was admitted under);
    adjacent spans of one version are merged. Without spans: the whole output under `default`."""
    out: list[tuple[int, int, int]] = []
    for raw in spans or ():
        span = WeightVersionSpan.model_validate(raw)
        version = label_version(span.version)
        version = default if version is None else version
        start, end = min(span.start, total), min(span.end, total)
        if end <= start:
            continue
        if out and out[-1][0] == version and out[-1][2] == start:
            out[-1] = (version, out[-1][1], end)
        else:
            out.append((version, start, end))
    if not out or out[0][1] != 0 or out[-1][2] != total or any(a[2] != b[1] for a, b in zip(out, out[1:])):
        return [(default, 0, total)] if total else []  # spans that do not tile the output: not trusted
    return out


# -- the update report -----------------------------------------------------------------------------------


class StepReport(BaseModel):
    """One step of an update on one engine."""

    step: StepName
    engine: str
    seconds: float
    ok: bool = True
    detail: str | None = None  # what the engine answered, or why the step failed or was skipped


class InFlight(BaseModel):
    """The engine's requests when the update paused it, and what became of them: `kept` were frozen and
    continued under the new weights (their tokens are split by version), `aborted` ended with
    finish_reason "abort" (the proxy reports them to the harness as retryable errors), `drained` finished
    under the old weights before the pause returned; `waiting` had not started and start on the new ones."""

    engine: str
    running: int = 0
    waiting: int = 0
    kept: int = 0
    aborted: int = 0
    drained: int = 0


class PolicyUpdateReport(BaseModel):
    """What `tracefleet policy update` (tracefleet.trainer.control.update_policy) did."""

    version: int
    weights: str
    label: str  # the weight-version label every engine now carries
    mark: VersionMark
    requested_mode: PauseMode
    modes: dict[str, PauseMode] = Field(default_factory=dict)  # engine -> the pause mode it used
    steps: list[StepReport] = Field(default_factory=list)
    in_flight: list[InFlight] = Field(default_factory=list)
    started_at: float
    seconds: float = 0.0  # wall time of the whole update
    paused_seconds: float = 0.0  # from the first engine paused to the last resumed: generation stopped this long
    # a load began and not every engine holds the new weights with their label: left paused, not resumed
    left_paused: bool = False
    # engine URL -> its pod, when the engines were resolved from a Kubernetes Service (one per replica)
    pods: dict[str, str] = Field(default_factory=dict)

    def step_seconds(self) -> dict[str, float]:
        """Seconds per step name, summed over engines."""
        out: dict[str, float] = {}
        for s in self.steps:
            out[s.step] = out.get(s.step, 0.0) + s.seconds
        return out

    def loop_figures(self) -> dict[str, float]:
        """What a training step's record (loop.jsonl) and its trackers hold of the update: sync and paused seconds."""
        return {"sync_s": round(self.seconds, 3), "paused_s": round(self.paused_seconds, 3)}

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.steps if s.step != "reset_cache")
