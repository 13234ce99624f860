"""The front doors install what they need and no more: `make quickstart` runs only the setup parts
the local job uses (no control-plane build, no harness CLIs, no S3 server or torch, no browser), `make train`
what `tracefleet train` needs (torch, vLLM, the harness CLIs; no control plane, S3 server, containers or browser),
and `make test` (what CI runs) runs every part. Read from `make -n`, as a newcomer would check it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PARTS = sorted(p.name for p in (REPO / "hack" / "setup.d").glob("*.sh"))
DOORS = {"quickstart", "train", "test", "images"}


def make_n(target: str) -> str:
    proc = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_every_part_names_known_doors() -> None:
    for part in PARTS:
        found = re.findall(r"^# doors: (.+)$", (REPO / "hack" / "setup.d" / part).read_text(), re.M)
        assert len(found) <= 1 and set((found or ["test"])[0].split()) <= DOORS, (part, found)


def test_quickstart_door_skips_what_the_local_job_does_not_use() -> None:
    out = make_n("quickstart")
    assert "bash hack/setup.sh quickstart" in out and "tracefleet run examples/quickstart/job.yaml" in out
    runs = out.split("# runs:", 1)[1].splitlines()[0].split()
    assert runs == ["10-python.sh", "40-engine.sh"], runs
    for heavy in ("controlplane", "harnesses", "traces", "browser", "vllm", "go build"):
        assert heavy not in out, (heavy, out)


def engine_part_trace(door: str) -> list[str]:
    """The commands hack/setup.d/40-engine.sh runs (warm: seconds) for `door`, from bash's trace."""
    env = {**os.environ, "TRACEFLEET_SETUP_DOOR": door}
    proc = subprocess.run(["bash", "-x", "hack/setup.d/40-engine.sh"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith("+")]


def test_quickstart_door_engine_part_installs_no_torch() -> None:
    """The engine part, run (warm: seconds) as the quickstart door runs it, never touches torch: SmolLM2's
    tokenizer converts without it (formats/gguf_tokenizer.py). Read from bash's trace of what it ran."""
    ran = engine_part_trace("quickstart")
    assert any("tracefleet.formats.models --ensure smollm2" in line for line in ran), ran
    assert not [line for line in ran if "torch" in line or "gemma" in line], ran


def test_train_door_installs_what_the_loop_needs() -> None:
    out = make_n("train")
    assert "bash hack/setup.sh train" in out and "tracefleet train examples/loop/job.yaml" in out
    runs = out.split("# runs:", 1)[1].splitlines()[0].split()
    assert runs == ["10-python.sh", "40-engine.sh", "45-vllm.sh", "50-harnesses.sh"], runs
    python = (REPO / "hack" / "setup.d" / "10-python.sh").read_text()
    assert 'train) extras="local,trainer"' in python  # torch comes with the package


def test_train_door_engine_part_takes_smollm2_without_llama_cpp() -> None:
    """`tracefleet train` serves with vLLM: the engine part (warm: seconds) only prepares SmolLM2, whose GGUF vLLM's
    conversion reads; no llama.cpp wheel, no Gemma. Read from bash's trace of what it ran."""
    ran = engine_part_trace("train")
    assert any("tracefleet.formats.models --ensure smollm2" in line for line in ran), ran
    assert not [line for line in ran if "llama_cpp" in line or "gemma" in line or "torch" in line], ran


def test_test_door_runs_every_part() -> None:
    out = make_n("test")
    assert "bash hack/setup.sh test" in out and "pytest" in out
    assert out.split("# runs:", 1)[1].splitlines()[0].split() == PARTS


def test_an_unknown_door_is_one_line() -> None:
    proc = subprocess.run(["bash", "hack/setup.sh", "quick"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == ["hack/setup.sh: unknown door 'quick' (quickstart, train, test or images)"]
