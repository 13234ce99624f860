#!/usr/bin/env python
"""Record the capture-log fixtures in tests/traces/data/ from real harness sessions through the proxy.

For each harness: a `tracefleet engine --backend scripted` subprocess (SmolLM2's real tokenizer and chat
template; two shell tool rounds, then a final text), a `tracefleet proxy` subprocess in front of it (server
mode, loopback, port 0), one session registered through the admin API, the pinned harness CLI run headless
through its preset (`tracefleet.runner.presets`) in a scratch git repository with a fresh HOME - inside a
loopback-only network namespace bridged to the proxy where user namespaces allow - and, after the session
is closed (log flushed), the proxy's capture log copied verbatim to tests/traces/data/recorded-<harness>.jsonl.

    .venv/bin/python hack/record_fixtures.py                  # all six harnesses
    .venv/bin/python hack/record_fixtures.py codex opencode   # some of them
    .venv/bin/python hack/record_fixtures.py --out /tmp/rec   # somewhere else

Needs the harness CLIs (`bash hack/setup.d/50-harnesses.sh`) and the engine's tokenizer
(`bash hack/setup.d/40-engine.sh`). The engine is deterministic, so a re-recording differs from the
committed files only in ids, timestamps and whatever the harness itself varies (dates, paths, its version).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from tracefleet.runner.presets import REAL_HARNESSES, installed_binary

REPO = Path(__file__).resolve().parents[1]
# The session steps and their checks are the harness tests' own (tests/fixtures/harness_runs.py): a fixture
# is recorded only from a session that passes what tests/proxy/test_harnesses.py asserts.
sys.path.insert(0, str(REPO / "tests"))
from fixtures.engines import EngineProcess  # noqa: E402
from fixtures.harness_runs import harness_script, run_through_proxy_process, session_problems  # noqa: E402

DEFAULT_OUT = REPO / "tests" / "traces" / "data"


def record(name: str, engine: EngineProcess, work: Path, out: Path) -> dict:
    """One headless session of `name` through a fresh proxy; the capture log lands in `out`."""
    engine.configure(**harness_script(name))
    run = run_through_proxy_process(name, engine.url, work, session_id=f"rec-{name}")
    problems = session_problems(run)
    if problems:
        raise RuntimeError(f"{name}: {'; '.join(problems)}\n{run.transcript}")
    target = out / f"recorded-{name}.jsonl"
    shutil.copyfile(run.closed.capture_path, target)
    return {"harness": name, "calls": run.closed.calls, "bytes": target.stat().st_size, "netns": run.netns,
            "seconds": round(run.duration_s, 1),
            "path": str(target.relative_to(REPO) if target.is_relative_to(REPO) else target)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("harnesses", nargs="*", default=list(REAL_HARNESSES), help=f"default: {' '.join(REAL_HARNESSES)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where the logs go (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    unknown = [n for n in args.harnesses if n not in REAL_HARNESSES]
    missing = [n for n in args.harnesses if n in REAL_HARNESSES and installed_binary(n) is None]
    if unknown or missing:
        print(f"unknown: {unknown}; not installed (run bash hack/setup.d/50-harnesses.sh): {missing}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="tracefleet-record-") as tmp:
        engine = EngineProcess(["--backend", "scripted", "--model", "smollm2"])
        try:
            for name in args.harnesses:
                work = Path(tmp) / name
                work.mkdir()
                try:
                    print(json.dumps(record(name, engine, work, args.out)), flush=True)
                except Exception as exc:  # noqa: BLE001 - report and go on with the next harness
                    failed += 1
                    print(f"FAILED {name}: {exc}", file=sys.stderr, flush=True)
        finally:
            engine.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
