"""Each choice a job makes is decided in few places, the same for both drivers (design §2.10), read from the source.

spec.harness.preset is decided in 5 files: what a preset makes of a session is looked up in one place.
    src/tracefleet/contract/job.py          the field and its rules (a command only with the `command` preset)
    src/tracefleet/contract/semantics.py    no preset means `command` (harness_preset)
    src/tracefleet/contract/session.py      HarnessConfig applies that rule, once, to every session's plan
    src/tracefleet/contract/images.py       a preset's default harness image (`command`: the tracefleet image)
    runner/presets/__init__.py              a preset's launch (argv, env, files) and the CLI it needs
  It is carried, never decided, by contract/plan.py (spec -> HarnessConfig), operator/config.py (fills the image from
  the plan), runner/preflight.py and runner/session.py (ask runner/presets).

spec.inference.sampling is decided in 4 files, and carried whole (a SamplingOverride) by contract/proxy_plan.py,
proxy/config.py, proxy/mode.py and proxy/exact/engine.py.
    src/tracefleet/contract/job.py          the field (RolloutSampling) and the override it states
    src/tracefleet/contract/sampling.py     SamplingOverride: the engine fields it sets
    src/tracefleet/contract/plan.py         plan_proxy: the job's ProxyPlan carries it (both drivers)
    proxy/token_engine.py                   every call's body gets it, and its record says `job` for it
  (`tracefleet train`, trainer/loop.py, refuses topP/topK it cannot score; `tracefleet proxy` without a job takes it
  as flags, proxy/cli.py.)

The sidecar's flags are its place's own (test_operator_children: no job-derived flag)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the drivers and what they share: the floor's folder, the session program, the operator, the proxy, the command
DRIVER_FOLDERS = ("src/tracefleet", "runner", "operator", "proxy", "images", "cli")


def _files_matching(pattern: str) -> set[str]:
    found = set()
    for folder in DRIVER_FOLDERS:
        for path in (REPO / folder).rglob("*.py"):
            code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
            if re.search(pattern, code):
                found.add(str(path.relative_to(REPO)))
    return found


def test_a_preset_is_decided_in_one_place_per_question() -> None:
    # the default rule applied (harness_preset), the `command` preset told apart, a preset looked up
    assert _files_matching(r"\bharness_preset\(") == {"src/tracefleet/contract/semantics.py",
                                                      "src/tracefleet/contract/session.py"}
    assert _files_matching(r"\bCOMMAND_PRESET\b") == {"src/tracefleet/contract/images.py"}
    assert _files_matching(r"\bget_preset\(|\bPRESETS\[") == {"runner/presets/__init__.py"}


def test_the_jobs_sampling_is_read_once_and_applied_once() -> None:
    assert _files_matching(r"(?<!spec\.)inference\.sampling\b") == {"src/tracefleet/contract/plan.py"}
    assert _files_matching(r"\bjob(_sampling)?\.fields\(\)") == {"proxy/token_engine.py"}
