"""Guided prefixes: a group of a task the policy rarely solves starts from the first turns of its demonstration.

BREAD and PrefixRL guide a hard problem with the start of a correct solution, given as context and never trained
on, shortened as the pass rate rises. Through a harness the unit is a model call: with `tracefleet train --guide
BELOW`, a group whose task's estimated pass rate p (the rollouts' own, tracefleet.trainer.task_sampler.PassRates:
guided sessions counted, so the guide withdraws as it works) is below BELOW gets the first

    k = ceil((L - 1) * (1 - p / BELOW))

of its L planned tool calls answered by the guide, and the policy answers every call after them. The guide is the
scripted engine playing the task's demonstration (`filetasks.demo_script`, the one `--demos` records), served to
the rollouts' proxy as its guide engine (ProxyConfig.guide_url); each session of the group is created with
`guided_calls` k (SessionPlan.guided_calls), so its first k calls reach the guide. Their records say `guided`, and
the trace builder makes their tokens context (loss mask 0, no span, no policy version): what the policy's calls
were conditioned on, never a trainable token (tests/proxy/test_proxy_guide.py, tests/trainer/test_bridges_guided.py).

The last call is always the policy's (k <= L - 1): a guide that made every call would leave the policy only the
closing text, and the judge, which reads the workspace, would reward the guide's work. So a task of one tool call
(`create`, `append`, `rename`) is never guided; `fix` (read, then edit) has its read answered until its rate reaches
BELOW. Every session of a group is guided alike, so the group's rewards compare the policy with itself. Held-out
sets are never guided.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracefleet.usage import UsageError

GUIDE_ENGINE_LOG = "guide-engine.log"
GUIDE_SCRIPT = "guide-script.json"


def guided_calls(plan_calls: int, rate: float, below: float) -> int:
    """How many of a task's first calls the guide answers: none at or above `below`, at most all but the last."""
    if below <= 0 or rate >= below or plan_calls < 2:
        return 0
    share = (plan_calls - 1) * (1.0 - rate / below)
    return min(plan_calls - 1, math.ceil(share - 1e-9))  # 1e-9: 4 * (1 - 0.3 / 0.4) is 1.0000000000000002


def plan_length(metadata: dict[str, Any], task_id: str, prompt: str, preset: str) -> int:
    """The tool calls of the task's demonstration in the harness's protocol (filetasks: Pi's tools or a shell)."""
    from tracefleet.trainer.filetasks import pi_steps, shell_commands, task_of

    task = task_of(metadata, task_id, prompt)
    return len(pi_steps(task)) if preset == "pi" else len(shell_commands(task))


@dataclass
class GuidedGroups:
    """The groups the rollouts guided: group id -> guided calls (0: not guided), decided once when its first session
    starts, and how many sessions each count went to."""

    calls: dict[str, int] = field(default_factory=dict)
    sessions: dict[int, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        guided = [k for k in self.calls.values() if k]
        return {"groups": len(self.calls), "guided_groups": len(guided),
                "sessions_by_guided_calls": {str(k): n for k, n in sorted(self.sessions.items())}}


class Guide:
    """The guide engine (the scripted engine with the job's demonstration script) and the rule above."""

    def __init__(self, job: Any, base_dir: Path, below: float) -> None:
        from tracefleet.contract.plan import harness_config
        from tracefleet.trainer import demos
        from tracefleet.trainer.jobs import job_tasks

        if not 0 < below <= 1:
            raise UsageError("--guide must be a pass rate in (0, 1]: groups of tasks solved less often are guided")
        tasks = job_tasks(job, base_dir)
        demos.demo_tasks(job, base_dir, len(tasks))  # every task must be one a script can solve
        mode = job.spec.inference.capture.mode
        if mode == "server":
            raise UsageError("--guide needs spec.inference.capture.mode exact or auto: in server mode the engine "
                             "re-renders the guide's turns, and the policy would not be conditioned on them as sent")
        self.job, self.below, self.tasks = job, below, tasks
        self.preset = harness_config(job).preset
        self.engine: Any = None
        self.groups = GuidedGroups()

    def start(self, run_dir: Path) -> str:
        """Start the guide engine; its URL (for the rollouts' proxy)."""
        from tracefleet.trainer.demos import start_script_engine

        self.engine = start_script_engine(self.job, self.tasks, run_dir / GUIDE_SCRIPT, run_dir / GUIDE_ENGINE_LOG)
        return str(self.engine.url)

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()
            self.engine = None

    def plan(self, plan: Any, rate: float) -> Any:
        """`plan` (a SessionPlan of the rollouts) with its group's guided calls: decided from `rate` (its task's
        estimated pass rate) when the group's first session starts, the same for the group's every session."""
        calls = self.groups.calls.get(plan.group_id)
        if calls is None:
            length = plan_length(plan.task.metadata, plan.task.id, plan.task.prompt, self.preset)
            calls = self.groups.calls[plan.group_id] = guided_calls(length, rate, self.below)
        self.groups.sessions[calls] = self.groups.sessions.get(calls, 0) + 1
        return plan.model_copy(update={"guided_calls": calls}) if calls else plan
